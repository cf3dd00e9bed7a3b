//! The budget on the server: a held row lock, a slow call.

use std::collections::BTreeMap;
use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use platformkit_limit::{ErrorKind, Key, LimitConn, Limiter, Postgres};
use tokio_postgres::error::SqlState;

use super::driver::{Driver, Lend, assert_idle_and_switch_off, hold, lend, text};
use super::{CountedOnce, assert_counted, counted_once, counts, wait_for_state};
use crate::common::db::{
    assert_no_lock_waits_soon, fresh_db, lock_row, stored, until_a_call_waits_on_a_lock,
};
use crate::common::faults::{end_slow_writes, slow_writes};
use crate::common::latency::Delayed;
use crate::common::metrics::Recorded;
use crate::common::{BUDGET, SLACK, assert_shed, limit, timed};

/// A row lock another session holds past the server's part of the budget:
/// the server ends the wait (`lock_timeout`) before the client gives up, as
/// a `LockTimeout` error, never an allow, counted as an `error` and never
/// as `unreachable`; nothing waits on after, the connection is idle with the
/// switch off, and the next call counts.
pub async fn a_held_row_lock_is_a_lock_timeout_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let CountedOnce {
        db,
        admin,
        held,
        limiter,
        login,
        alice,
    } = counted_once::<D>(BUDGET).await;

    let locker = lock_row(&db, &stored(&login, &alice)).await;
    let (result, _) = timed(BUDGET + SLACK, "held lock", limiter.failed(&login, &alice)).await;
    let err = result.expect_err("a held lock gave a verdict");
    assert_eq!(err.kind(), ErrorKind::LockTimeout, "{err:?}");
    assert_eq!(err.code(), Some(&SqlState::LOCK_NOT_AVAILABLE));
    assert!(!err.is_unreachable());

    // The server gave up the wait by itself, lock still held.
    assert_no_lock_waits_soon(&admin, "after the lock timeout").await;
    assert_idle_and_switch_off::<D>(&held, "after the lock timeout").await;

    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_counted(&limiter.failed(&login, &alice).await.unwrap(), 2, "after");

    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.calls("login", "failed", "unreachable"), 0);
    assert_eq!(recorded.calls("login", "failed", "error"), 1);
    assert_eq!(recorded.calls("login", "failed", "allowed"), 2);
}

/// A server slow for reasons no `lock_timeout` covers (every write sleeps
/// 0.8 s), on a limiter that has not heard from the server before: within
/// its budget of 0.3 s on either driver, never counted.
///
/// tokio-postgres cancels the `CALL` on the server before the deadline and
/// the server answers the cancel: it is up and slow, so the call is shed
/// (refused, `Overloaded`, 57014); nothing is written and the connection is
/// idle at once. sqlx cannot cancel: the statement gets no answer at all
/// within the budget, and the server answers the probe that follows, so
/// the call is shed too; the `CALL` goes on alone and commits, so the
/// failure the verdict did not count is in the table after all, and the
/// connection's next statement waits for it. Either way the connection
/// goes back idle, the switch off.
pub async fn a_slow_call_ends_within_the_budget_shed_on_every_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    slow_writes(&db).await;
    let held = hold::<D>(&db.config()).await;
    let budget = Duration::from_millis(300);
    let store = Postgres::new(lend::<D>(&held)).with_probe(D::source(&db.config()));
    let limiter = Limiter::builder(store).budget(budget).build().unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");

    let (verdict, _) = timed(budget + SLACK, "slow", limiter.failed(&login, &alice)).await;
    let verdict = verdict.unwrap();
    if D::CANCELS {
        assert_shed(&verdict, "a slow call the server stopped");
        assert_eq!(
            verdict.shed().unwrap().code(),
            Some(&SqlState::QUERY_CANCELED),
            "the server stopped the call at the limiter's cancel request"
        );
    } else {
        assert_shed(
            &verdict,
            "a slow call the server answered a probe meanwhile",
        );
        assert_eq!(
            verdict.shed().unwrap().code(),
            None,
            "the client gave up; the server did not stop"
        );
    }

    // The connection's next statement comes after the limiter's (cancelled,
    // or finished alone).
    assert_idle_and_switch_off::<D>(&held, "after the slow call").await;
    let written = if D::CANCELS { 0 } else { 1 };
    let expected: BTreeMap<String, i64> = (written > 0)
        .then(|| (stored(&login, &alice), written))
        .into_iter()
        .collect();
    assert_eq!(counts(&db).await, expected, "what the slow call left");

    end_slow_writes(&db).await;
    let next = limiter.failed(&login, &alice).await.unwrap();
    assert_counted(&next, written as u64 + 1, "the next call");
}

/// A call given up while its `CALL` waits on a row lock (its future dropped,
/// as at the end of its budget or when the request goes away), whose
/// answer, the lock timeout's error, comes only after: that late answer
/// belongs to no one. Once the lock is gone, the next call on the same held
/// connection is counted (not that old `LockTimeout`), and the service's
/// own next statement on it answers.
pub async fn a_late_error_of_a_call_given_up_reaches_no_later_statement<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let CountedOnce {
        db,
        admin,
        held,
        limiter,
        login,
        alice,
    } = counted_once::<D>(BUDGET).await;

    let locker = lock_row(&db, &stored(&login, &alice)).await;
    let pid = {
        let call = limiter.failed(&login, &alice);
        tokio::pin!(call);
        tokio::select! {
            answer = &mut call => panic!("answered while the row is locked: {answer:?}"),
            pid = until_a_call_waits_on_a_lock(&admin, BUDGET) => pid,
        }
        // The call is dropped here, its `CALL` still waiting on the lock.
    };
    // The server's lock timeout ends the wait; its error is owed to the
    // call given up.
    wait_for_state(&admin, pid, Some("idle"), BUDGET + SLACK).await;
    locker.batch_execute("ROLLBACK").await.unwrap();

    let next = limiter.failed(&login, &alice).await;
    let next = next.unwrap_or_else(|e| panic!("the next call got an error: {e:?}"));
    assert_counted(&next, 2, "the next call on the held connection");
    assert_eq!(
        text::<D>(&held, "SELECT 1").await.as_deref(),
        Some("1"),
        "the service's own next statement"
    );
    assert_idle_and_switch_off::<D>(&held, "after").await;
}

/// Over a link whose round trip is 50 ms (a proxy that delays each way by
/// 25 ms), a call with a budget of 200 ms on a row another session holds:
/// the budget's split counts the round trip the store measured, so the
/// server's lock waits end, and their `55P03` is back, before the client's
/// deadline: a `LockTimeout` error on either driver (or, on a machine too
/// loaded to bring it back in time, a shed call), never an allow; and
/// once the lock is gone, the same connection counts again (the failed
/// attempts counted nothing).
pub async fn a_held_row_over_a_long_round_trip_is_a_lock_timeout_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let server = db.config();
    let port = server.get_ports().first().copied().expect("a port");
    let proxy = Delayed::to(port, Duration::from_millis(25)).await;
    let mut far = tokio_postgres::Config::new();
    far.host("127.0.0.1")
        .port(proxy.port)
        .user(server.get_user().expect("a user"))
        .dbname(server.get_dbname().expect("a database"));
    if let Some(password) = server.get_password() {
        far.password(password);
    }
    let held = hold::<D>(&far).await;
    let budget = Duration::from_millis(200);
    let limiter = Limiter::builder(Postgres::new(lend::<D>(&held)))
        .budget(budget)
        .no_refusal_cache()
        .build()
        .unwrap();
    // The calls that only set the scene go through a limiter on the same
    // connection with the default budget: on a loaded machine a 200 ms
    // budget over this link may rightly shed them.
    let patient = Limiter::builder(Postgres::new(lend::<D>(&held)))
        .no_refusal_cache()
        .build()
        .unwrap();
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    // A few answered calls: the store learns the round trip (the first of
    // each statement on a connection through `Prepared` takes two).
    let warm = Key::email("warm@example.com");
    for _ in 0..5 {
        limiter.check(&login, &warm).await.unwrap();
        limiter.failed(&login, &warm).await.unwrap();
    }
    for n in 1..=3 {
        let verdict = patient.failed(&login, &alice).await.unwrap();
        assert_counted(&verdict, n, &format!("far: {verdict:?}"));
    }

    let locker = lock_row(&db, &stored(&login, &alice)).await;
    for attempt in 0..3 {
        let (result, _) = timed(budget + SLACK, "far", limiter.failed(&login, &alice)).await;
        match result {
            Err(err) => assert_eq!(
                err.kind(),
                ErrorKind::LockTimeout,
                "attempt {attempt}: {err:?}"
            ),
            // On a machine too loaded to bring the server's 55P03 back
            // within 200 ms, the server still answered this call's cancel
            // request: up and slow, so shed, never allowed.
            Ok(verdict) => assert_shed(&verdict, &format!("attempt {attempt}")),
        }
    }
    locker.batch_execute("ROLLBACK").await.unwrap();
    let after = patient.failed(&login, &alice).await.unwrap();
    assert_counted(&after, 4, &format!("after: {after:?}"));
}

/// However many sessions queue on a held row (eight replicas, each a
/// limiter of its own), every waiter's answer is `LockTimeout` within its
/// budget: the server bounds all of a call's lock waits together, never one
/// acquisition at a time, so no waiter runs past its budget into a cancel.
pub async fn every_waiter_on_a_held_row_is_a_lock_timeout_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    const REPLICAS: usize = 8;
    let db = fresh_db().await;
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    let mut replicas = Vec::with_capacity(REPLICAS);
    for _ in 0..REPLICAS {
        let held = hold::<D>(&db.config()).await;
        let limiter = Limiter::builder(Postgres::new(lend::<D>(&held)))
            .budget(BUDGET)
            .build()
            .unwrap();
        replicas.push(std::sync::Arc::new(limiter));
    }
    replicas[0].failed(&login, &alice).await.unwrap();

    let locker = lock_row(&db, &stored(&login, &alice)).await;
    let mut waiters = Vec::with_capacity(REPLICAS);
    for limiter in &replicas {
        let (limiter, login, alice) = (limiter.clone(), login.clone(), alice.clone());
        waiters.push(tokio::spawn(async move {
            timed(BUDGET + SLACK, "a waiter", limiter.failed(&login, &alice)).await
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, waiter) in waiters.into_iter().enumerate() {
        let (result, _) = waiter.await.unwrap();
        let err = result.expect_err("a waiter on a held row gave a verdict");
        assert_eq!(err.kind(), ErrorKind::LockTimeout, "waiter {i}: {err:?}");
    }
    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_counted(
        &replicas[1].failed(&login, &alice).await.unwrap(),
        2,
        "after",
    );
}
