//! Attempts reserved up front, and what a limit does when the database is
//! gone, against real PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use crate::common;
use common::verdicts::assert_refused;
use platformkit_limit::{
    ErrorKind, Key, Limit, LimitConn, Limiter, ManualClock, OnSuccess, Postgres, Reservation,
    Reservations, SCHEMA, WhenUnreachable,
};
use platformkit_limit_testdb::{Server, TestDb};
use tokio::sync::{Barrier, Mutex, OwnedMutexGuard};
use tokio_postgres::Client;

/// A small pool: `size` held connections, lent round-robin.
async fn held_connections(
    db: &TestDb,
    size: usize,
) -> impl LimitConn<Conn = OwnedMutexGuard<Client>> + Clone + 'static {
    let mut clients = Vec::with_capacity(size);
    for _ in 0..size {
        clients.push(Arc::new(Mutex::new(db.connect().await)));
    }
    let clients = Arc::new(clients);
    let next = Arc::new(AtomicUsize::new(0));
    move || {
        let clients = clients.clone();
        let at = next.fetch_add(1, Ordering::Relaxed) % clients.len();
        async move { Ok::<_, std::convert::Infallible>(clients[at].clone().lock_owned().await) }
    }
}

const ATTEMPTS: usize = 200;
const MAX: u32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserving_lets_at_most_max_of_200_concurrent_attempts_reach_the_work() {
    let db = Server::shared().database(SCHEMA).await;
    let limiter = Arc::new(
        Limiter::builder(Postgres::new(held_connections(&db, 16).await))
            .budget(Duration::from_secs(30))
            .build()
            .expect("a budget"),
    );
    let limit = Limit::new("redeem", MAX, Duration::from_secs(3600)).expect("a limit");

    // Every attempt asks first, and none does its work until all have asked:
    // the burst of a credential-stuffing run.
    let run = |reserve: bool, key: Key| {
        let barrier = Arc::new(Barrier::new(ATTEMPTS));
        let reached = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..ATTEMPTS)
            .map(|_| {
                let (limiter, limit, key) = (limiter.clone(), limit.clone(), key.clone());
                let (barrier, reached) = (barrier.clone(), reached.clone());
                tokio::spawn(async move {
                    if reserve {
                        let reservation = limiter.reserve(&limit, &key).await.expect("a verdict");
                        assert!(!reservation.verdict().is_unreachable());
                        barrier.wait().await;
                        if let Reservation::Granted(permit) = reservation {
                            reached.fetch_add(1, Ordering::SeqCst);
                            permit.failed(); // a wrong guess
                        }
                    } else {
                        let verdict = limiter.check(&limit, &key).await.expect("a verdict");
                        assert!(!verdict.is_unreachable());
                        barrier.wait().await;
                        if verdict.is_allowed() {
                            reached.fetch_add(1, Ordering::SeqCst);
                            limiter.failed(&limit, &key).await.expect("a verdict");
                        }
                    }
                })
            })
            .collect();
        async move {
            for task in tasks {
                task.await.expect("an attempt");
            }
            reached.load(Ordering::SeqCst)
        }
    };
    let reserved = run(true, Key::opaque("order-1")).await;
    let raced = run(false, Key::opaque("order-2")).await;
    println!(
        "{ATTEMPTS} concurrent attempts at a limit of {MAX}: reserve let {reserved} reach the work, \
         check-then-failed let {raced}"
    );
    assert_eq!(reserved, MAX as usize, "reserve lets exactly max through");
    assert!(
        raced > 10 * MAX as usize,
        "check-then-failed races ({raced})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_permit_takes_its_attempt_back_and_a_dropped_one_stays_counted() {
    let db = Server::shared().database(SCHEMA).await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let limit = Limit::new("login", 2, Duration::from_secs(3600)).expect("a limit");
    let key = Key::opaque("account");
    let count = async |limiter: &Limiter<_>| {
        limiter
            .check(&limit, &key)
            .await
            .expect("a verdict")
            .count()
    };

    let Reservation::Granted(permit) = limiter.reserve(&limit, &key).await.expect("a verdict")
    else {
        panic!("the first attempt is granted");
    };
    assert_eq!(permit.verdict().count(), Some(1));
    permit.succeeded().await.expect("taken back");
    assert_eq!(count(&limiter).await, Some(0));

    let first = limiter.reserve(&limit, &key).await.expect("a verdict");
    drop(first); // no report: stays counted as a failure
    let second = limiter.reserve(&limit, &key).await.expect("a verdict");
    assert!(matches!(second, Reservation::Granted(_)));
    drop(second);
    assert_eq!(count(&limiter).await, Some(2));
    let third = limiter.reserve(&limit, &key).await.expect("a verdict");
    let Reservation::Refused(verdict) = third else {
        panic!("the third attempt in the window is refused");
    };
    assert!(verdict.retry_after().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_that_resets_on_success_clears_the_key() {
    let db = Server::shared().database(SCHEMA).await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let limit = Limit::builder("login", 5, Duration::from_secs(3600))
        .on_success(OnSuccess::Reset)
        .build()
        .expect("a limit");
    let key = Key::opaque("account");
    for _ in 0..3 {
        limiter.failed(&limit, &key).await.expect("a verdict");
    }
    let Reservation::Granted(permit) = limiter.reserve(&limit, &key).await.expect("a verdict")
    else {
        panic!("granted");
    };
    assert_eq!(permit.verdict().count(), Some(4));
    permit.succeeded().await.expect("reset");
    let after = limiter.check(&limit, &key).await.expect("a verdict");
    assert_eq!(after.count(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_back_after_the_window_closed_leaves_the_next_window_alone() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let limiter = Limiter::new(Postgres::new(db.config()).with_clock(clock.clone()));
    let limit = Limit::new("login", 5, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("account");
    let Reservation::Granted(early) = limiter.reserve(&limit, &key).await.expect("a verdict")
    else {
        panic!("granted");
    };
    clock.advance(Duration::from_secs(60));
    let late = limiter.reserve(&limit, &key).await.expect("a verdict");
    assert_eq!(late.verdict().count(), Some(1), "a new window");
    early
        .succeeded()
        .await
        .expect("taken back from its own window");
    let now = limiter.check(&limit, &key).await.expect("a verdict");
    assert_eq!(now.count(), Some(1), "the new window keeps its attempt");
}

/// A connection source that can be switched off, like a database that goes
/// away and comes back.
fn switchable(db: &TestDb) -> (impl LimitConn + 'static, Arc<AtomicBool>) {
    let down = Arc::new(AtomicBool::new(false));
    let config = db.config();
    let flag = down.clone();
    let conns = move || {
        let config = config.clone();
        let down = flag.load(Ordering::SeqCst);
        async move {
            if down {
                // Nothing listens at its address: down, with no probe.
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
            }
            let conn: Result<_, platformkit_limit::BoxError> =
                platformkit_limit::LimitConn::conn(&config)
                    .await
                    .map_err(Into::into);
            conn
        }
    };
    (conns, down)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_choice_for_an_unreachable_database_is_kept_and_said() {
    let db = Server::shared().database(SCHEMA).await;
    let (conns, down) = switchable(&db);
    let limiter = Limiter::new(Postgres::new(conns));
    let key = Key::opaque("account");
    let allow = Limit::new("allow", 2, Duration::from_secs(3600)).expect("a limit");
    let refuse = Limit::builder("refuse", 2, Duration::from_secs(3600))
        .when_unreachable(WhenUnreachable::Refuse)
        .build()
        .expect("a limit");
    let local = Limit::builder("local", 2, Duration::from_secs(3600))
        .when_unreachable(WhenUnreachable::CountLocally)
        .build()
        .expect("a limit");

    limiter
        .failed(&local, &key)
        .await
        .expect("counted in the database");
    down.store(true, Ordering::SeqCst);

    // Allow: fail-open, nothing counted, and said.
    for _ in 0..5 {
        let verdict = limiter.hit(&allow, &key).await.expect("a verdict");
        assert!(verdict.is_allowed() && verdict.is_unreachable());
        assert_eq!(verdict.count(), None);
        assert_eq!(
            verdict.unreachable().map(|e| e.kind()),
            Some(ErrorKind::Connect)
        );
    }
    // Refuse: fail-closed, and said.
    let verdict = limiter.check(&refuse, &key).await.expect("a verdict");
    assert!(verdict.is_refused() && verdict.is_unreachable());
    assert_eq!(verdict.retry_after(), None);
    // Count locally: the replica holds the line at max on its own count.
    let verdicts = [
        limiter.hit(&local, &key).await.expect("a verdict"),
        limiter.hit(&local, &key).await.expect("a verdict"),
        limiter.hit(&local, &key).await.expect("a verdict"),
    ];
    assert!(verdicts.iter().all(|v| v.is_unreachable()));
    assert_eq!(
        verdicts.iter().map(|v| v.is_allowed()).collect::<Vec<_>>(),
        [true, true, false]
    );
    assert_eq!(verdicts[2].count(), Some(3));

    // Back: the database's count again, as it was before the outage.
    down.store(false, Ordering::SeqCst);
    let verdict = limiter.check(&local, &key).await.expect("a verdict");
    assert!(!verdict.is_unreachable());
    assert_eq!(verdict.count(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lockout_outlasts_the_window_that_reached_max() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 60 * 60));
    // The refusal cache is off, so every check below reads the lockout from
    // the database.
    let limiter = Limiter::builder(Postgres::new(db.config()).with_clock(clock.clone()))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let limit = Limit::builder("login", 3, Duration::from_secs(60))
        .lockout(Duration::from_secs(600))
        .build()
        .expect("a limit");
    let key = Key::opaque("account");
    clock.advance(Duration::from_secs(10));
    for _ in 0..3 {
        limiter.failed(&limit, &key).await.expect("a verdict");
    }
    let refused = limiter.check(&limit, &key).await.expect("a verdict");
    assert!(refused.is_refused());
    let reopens = refused.reopens_at().expect("a reopening");
    let window_end = UNIX_EPOCH + Duration::from_secs(1_800_000_000 / 60 * 60 + 60);
    assert_eq!(reopens, window_end + Duration::from_secs(600));

    // A new window has begun, but the lockout holds.
    clock.set(window_end + Duration::from_secs(1));
    let still = limiter.check(&limit, &key).await.expect("a verdict");
    assert!(still.is_refused(), "locked out after the window ended");
    assert_eq!(still.count(), Some(0));
    assert_eq!(still.retry_after(), Some(Duration::from_secs(599)));

    // And lifts when it ends.
    clock.set(window_end + Duration::from_secs(600));
    assert!(
        limiter
            .check(&limit, &key)
            .await
            .expect("a verdict")
            .is_allowed()
    );

    // A reset clears a lockout too.
    clock.set(window_end + Duration::from_secs(700));
    for _ in 0..3 {
        limiter.failed(&limit, &key).await.expect("a verdict");
    }
    clock.advance(Duration::from_secs(60));
    assert_refused(&limiter, &limit, &key).await;
    limiter.reset(&limit, &key).await.expect("a reset");
    assert!(
        limiter
            .check(&limit, &key)
            .await
            .expect("a verdict")
            .is_allowed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_all_takes_back_where_each_pair_was_counted() {
    let db = Server::shared().database(SCHEMA).await;
    let (conns, down) = switchable(&db);
    let limiter = Limiter::new(Postgres::new(conns));
    let key = Key::opaque("account");
    let allow = Limit::new("allow", 2, Duration::from_secs(3600)).expect("a limit");
    let local = Limit::builder("local", 2, Duration::from_secs(3600))
        .when_unreachable(WhenUnreachable::CountLocally)
        .build()
        .expect("a limit");
    let pairs = [(&allow, &key), (&local, &key)];

    // In the store: taken back from the store.
    let Reservations::Granted(permits) = limiter.reserve_all(&pairs).await.expect("verdicts")
    else {
        panic!("granted");
    };
    permits.succeeded().await.expect("taken back");
    assert_eq!(
        common::verdicts::counts_of(&limiter, &pairs).await,
        [Some(0), Some(0)]
    );

    // Unreachable: `allow` counted nowhere, `local` in this process; a
    // success takes back only what was counted, from where it was.
    down.store(true, Ordering::SeqCst);
    let Reservations::Granted(permits) = limiter.reserve_all(&pairs).await.expect("verdicts")
    else {
        panic!("granted while unreachable");
    };
    assert!(permits.verdicts().is_unreachable());
    assert_eq!(
        common::verdicts::counts(permits.verdicts()),
        [None, Some(1)]
    );
    permits.succeeded().await.expect("taken back locally");
    let local_count = limiter.check(&local, &key).await.expect("a verdict");
    assert!(local_count.is_unreachable());
    assert_eq!(local_count.count(), Some(0), "the local count, taken back");
}
