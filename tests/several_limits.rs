//! Several limits in one call: one statement, the verdict names the limit
//! that refused, and calls over the same pairs in opposite orders cannot
//! deadlock; several limits reserved at once.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::common;
use common::db::fresh_db;
use common::verdicts::counts_of;
use platformkit_limit::{
    ErrorKind, Key, Limit, Limiter, ManualClock, Memory, Postgres, Reservations,
};
use tokio::sync::Mutex;

fn account() -> Key {
    Key::email("alice@example.com")
}

fn address() -> Key {
    Key::ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_call_counts_every_limit_and_names_the_one_that_refused() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let per_account = Limit::new("login-account", 3, Duration::from_secs(900)).expect("a limit");
    let per_address = Limit::new("login-address", 5, Duration::from_secs(60)).expect("a limit");
    let (account, address) = (account(), address());
    let pairs = [(&per_account, &account), (&per_address, &address)];

    for n in 1..=2_u64 {
        let verdicts = limiter.failed_all(&pairs).await.expect("verdicts");
        assert!(verdicts.is_allowed());
        let counts: Vec<_> = verdicts.iter().map(|v| v.count()).collect();
        assert_eq!(counts, [Some(n), Some(n)]);
    }
    let third = limiter.failed_all(&pairs).await.expect("verdicts");
    assert!(third.is_refused());
    let refused = third.refused_by().expect("a refusing limit");
    assert_eq!(refused.limit(), "login-account");
    assert!(third.retry_after().is_some());

    // The same counts one pair at a time: one row per pair, shared.
    let alone = limiter
        .check(&per_address, &address)
        .await
        .expect("a verdict");
    assert_eq!(alone.count(), Some(3));
    let checked = limiter.check_all(&pairs).await.expect("verdicts");
    assert_eq!(
        checked.iter().map(|v| v.count()).collect::<Vec<_>>(),
        [Some(3), Some(3)]
    );
    assert_eq!(
        checked.refused_by().map(|v| v.limit()),
        Some("login-account")
    );

    // hit_all counts the ask under every limit; a pair given twice counts
    // twice.
    let forgot = Limit::new("forgot", 2, Duration::from_secs(3600)).expect("a limit");
    let twice = [(&forgot, &account), (&forgot, &account)];
    let verdicts = limiter.hit_all(&twice).await.expect("verdicts");
    assert_eq!(
        verdicts.iter().map(|v| v.count()).collect::<Vec<_>>(),
        [Some(2), Some(2)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_pairs_and_too_many_pairs_are_refused() {
    let limiter = Limiter::new(Memory::new());
    let error = limiter.check_all(&[]).await.expect_err("no pairs");
    assert_eq!(error.kind(), ErrorKind::InvalidOption);
    let limit = Limit::new("l", 1, Duration::from_secs(1)).expect("a limit");
    let key = Key::opaque("k");
    let many = vec![(&limit, &key); Limiter::MAX_PAIRS + 1];
    let error = limiter.failed_all(&many).await.expect_err("too many");
    assert_eq!(error.kind(), ErrorKind::InvalidOption);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_in_concurrent_calls_cannot_deadlock() {
    let db = fresh_db().await;
    let limits: Vec<Limit> = (0..4)
        .map(|i| {
            Limit::new(&format!("l{i}"), 1_000_000, Duration::from_secs(3600)).expect("a limit")
        })
        .collect();
    let keys: Vec<Key> = (0..4).map(|i| Key::opaque(&format!("k{i}"))).collect();
    const TASKS: usize = 8;
    const CALLS: usize = 40;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (limits, keys) = (limits.clone(), keys.clone());
        let client = Arc::new(Mutex::new(db.connect().await));
        // A deadlock would be found by PostgreSQL's detector within a
        // second (40P01, a hard error); the budget only bounds lock waits.
        let limiter = Limiter::builder(Postgres::new(move || {
            let client = client.clone();
            async move { Ok::<_, std::convert::Infallible>(client.lock_owned().await) }
        }))
        .budget(Duration::from_secs(30))
        .build()
        .expect("a budget");
        tasks.push(tokio::spawn(async move {
            let mut pairs: Vec<(&Limit, &Key)> = limits.iter().zip(&keys).collect();
            if task % 2 == 1 {
                pairs.reverse();
            }
            for _ in 0..CALLS {
                let verdicts = limiter
                    .failed_all(&pairs)
                    .await
                    .expect("no deadlock, no error");
                assert!(!verdicts.is_unreachable());
            }
        }));
    }
    for task in tasks {
        task.await.expect("a task");
    }
    let admin = db.connect_admin().await;
    let counts: Vec<i64> = admin
        .query(
            "SELECT count FROM platformkit.platformkit_limits ORDER BY key",
            &[],
        )
        .await
        .expect("a system read")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        counts,
        vec![(TASKS * CALLS) as i64; 4],
        "every call counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_all_counts_under_every_limit_and_a_success_takes_each_back() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let per_account = Limit::new("login-account", 2, Duration::from_secs(900)).expect("a limit");
    let per_address = Limit::new("login-address", 5, Duration::from_secs(900)).expect("a limit");
    let (account, address) = (account(), address());
    let pairs = [(&per_account, &account), (&per_address, &address)];
    let counts = async || counts_of(&limiter, &pairs).await;

    // Granted: counted under both, then taken back from both.
    let Reservations::Granted(permits) = limiter.reserve_all(&pairs).await.expect("verdicts")
    else {
        panic!("the first attempt is granted");
    };
    assert_eq!(
        common::verdicts::counts(permits.verdicts()),
        [Some(1), Some(1)]
    );
    permits.succeeded().await.expect("taken back");
    assert_eq!(counts().await, [Some(0), Some(0)]);

    // Two failures: dropped permits stay counted under both.
    for _ in 0..2 {
        let reservations = limiter.reserve_all(&pairs).await.expect("verdicts");
        let Reservations::Granted(permits) = reservations else {
            panic!("granted while under both limits");
        };
        permits.failed();
    }
    assert_eq!(counts().await, [Some(2), Some(2)]);

    // The third is refused by the account's limit, and counted under both.
    let refused = limiter.reserve_all(&pairs).await.expect("verdicts");
    let Reservations::Refused(verdicts) = refused else {
        panic!("the account's limit refuses");
    };
    assert_eq!(
        verdicts.refused_by().map(|v| v.limit()),
        Some("login-account")
    );
    assert!(verdicts.retry_after().is_some());
    assert_eq!(counts().await, [Some(3), Some(3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_all_of_one_pair_is_reserve() {
    let limiter = Limiter::new(Memory::new());
    let limit = Limit::new("redeem", 1, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("order-7");
    let Reservations::Granted(permits) = limiter.reserve_all(&[(&limit, &key)]).await.expect("ok")
    else {
        panic!("granted");
    };
    assert_eq!(permits.verdicts().iter().count(), 1);
    permits.failed();
    let refused = limiter.reserve_all(&[(&limit, &key)]).await.expect("ok");
    assert!(refused.verdicts().is_refused());
    let error = limiter.reserve_all(&[]).await.expect_err("no pairs");
    assert_eq!(error.kind(), ErrorKind::InvalidOption);
}

/// All or nothing under concurrency: eight connections' callers, half
/// giving the pairs in the opposite order, and a quarter counting with
/// `hit_all` under one of the same rows and another, never deadlock, and
/// never together go past a limit: exactly `max` asks go ahead, and each
/// adds under both of its limits, the refused under neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_in_concurrent_calls_never_passes_a_limit_nor_deadlocks() {
    let db = fresh_db().await;
    let per_hour = Limit::new("api-hour", 25, Duration::from_secs(3600)).expect("a limit");
    let per_day = Limit::new("api-day", 100_000, Duration::from_secs(86_400)).expect("a limit");
    let other = Limit::new("other", 100_000, Duration::from_secs(86_400)).expect("a limit");
    let client = Key::opaque("client-9");
    // A pinned clock: the run never crosses an hour's edge.
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    const TASKS: usize = 8;
    const CALLS: usize = 25;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let limits = (per_hour.clone(), per_day.clone(), other.clone());
        let client = client.clone();
        let conn = Arc::new(Mutex::new(db.connect().await));
        // A deadlock would be PostgreSQL's 40P01 within a second, a hard
        // error; the budget only bounds the lock waits.
        let limiter = Limiter::builder(
            Postgres::new(move || {
                let conn = conn.clone();
                async move { Ok::<_, std::convert::Infallible>(conn.lock_owned().await) }
            })
            .with_clock(clock.clone()),
        )
        .budget(Duration::from_secs(30))
        .no_refusal_cache()
        .build()
        .expect("a budget");
        tasks.push(tokio::spawn(async move {
            let (per_hour, per_day, other) = &limits;
            let attack = task % 4 == 3;
            let mut pairs = if attack {
                vec![(per_day, &client), (other, &client)]
            } else {
                vec![(per_hour, &client), (per_day, &client)]
            };
            if task % 2 == 1 {
                pairs.reverse();
            }
            let mut allowed = 0;
            for _ in 0..CALLS {
                let verdicts = if attack {
                    limiter.hit_all(&pairs).await
                } else {
                    limiter.hit_all_or_nothing(&pairs).await
                };
                let verdicts = verdicts.expect("no deadlock, no error");
                assert!(!verdicts.is_unreachable() && !verdicts.is_shed());
                if !attack && verdicts.is_allowed() {
                    allowed += 1;
                }
            }
            allowed
        }));
    }
    let mut allowed = 0;
    for task in tasks {
        allowed += task.await.expect("a task");
    }
    assert_eq!(allowed, 25, "150 asks, a max of 25: exactly 25 go ahead");
    let hit_all = (TASKS / 4 * CALLS) as u64;
    let sum = Limiter::new(Postgres::new(db.config()).with_clock(clock));
    let pairs = [(&per_hour, &client), (&per_day, &client), (&other, &client)];
    assert_eq!(
        counts_of(&sum, &pairs).await,
        [Some(25), Some(25 + hit_all), Some(hit_all)],
        "each all-or-nothing ask under both or neither"
    );
}
