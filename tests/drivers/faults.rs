//! Down or not: a call that got no answer is allowed (loudly, within the
//! budget) only when a probe of the server finds it down; a connection
//! killed or terminated on a server that answers the probe is shed.

use std::collections::BTreeMap;
use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use platformkit_limit::{ErrorKind, Key, LimitConn, Limiter, Postgres};

use super::driver::{Driver, Lend, backend_pid};
use super::{
    CountedOnce, assert_counted, assert_unreachable, counted_once, counts, wait_for_state,
};
use crate::common::db::{fresh_db, lock_row, nothing_listens, stored, terminate_backend};
use crate::common::faults::kill_while_it_waits_on_a_lock;
use crate::common::metrics::Recorded;
use crate::common::{BUDGET, SLACK, assert_shed, limit, timed};

/// Nothing listens where the source points: every call is allowed,
/// unreachable, within the budget; a reset is an unreachable error. Each is
/// counted once, as `unreachable`.
pub async fn nothing_listening_is_unreachable_within_the_budget<D: Driver>() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let limiter = Limiter::builder(Postgres::new(D::source(&nothing_listens())))
        .budget(BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 3);
    let alice = Key::email("alice@example.com");

    // tokio-postgres is refused at once (Connect); sqlx's pool retries a
    // refused connection until the budget ends it (Timeout).
    let unreachable = [ErrorKind::Connect, ErrorKind::Timeout];
    for op in ["check", "failed", "hit"] {
        let call = async {
            match op {
                "check" => limiter.check(&login, &alice).await,
                "failed" => limiter.failed(&login, &alice).await,
                _ => limiter.hit(&login, &alice).await,
            }
        };
        let (verdict, _) = timed(BUDGET + SLACK, op, call).await;
        assert_unreachable(&verdict.unwrap(), &unreachable, op);
    }
    let (reset, _) = timed(BUDGET + SLACK, "reset", limiter.reset(&login, &alice)).await;
    let err = reset.unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");

    let recorded = Recorded::take(&snapshotter);
    for op in ["check", "failed", "hit", "reset"] {
        assert_eq!(recorded.calls("login", op, "unreachable"), 1, "{op}");
    }
}

/// A connection terminated between two calls (`57P01`, which a role that
/// may signal the limiter's backends can send): the server answers a
/// probe, so the next call is shed, never allowed.
pub async fn a_terminated_connection_is_shed_while_the_server_is_up<D: Driver>()
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

    let pid = backend_pid::<D>(&held).await;
    terminate_backend(&admin, pid).await;
    wait_for_state(&admin, pid, None, Duration::from_secs(5)).await;

    let what = "a call on a terminated connection";
    let (verdict, _) = timed(BUDGET + SLACK, what, limiter.failed(&login, &alice)).await;
    assert_shed(&verdict.unwrap(), what);
    assert_eq!(
        counts(&db).await,
        BTreeMap::from([(stored(&login, &alice), 1)])
    );
}

/// A connection killed while its call waits on a row lock: the call ends at
/// once, long before its budget, shed (the server answers a probe), and is
/// counted as `shed`, never as an error or an allow.
pub async fn a_connection_killed_mid_call_ends_at_once<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    // Long, so that only the kill can end the call early.
    const KILL_BUDGET: Duration = Duration::from_secs(5);
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
    } = counted_once::<D>(KILL_BUDGET).await;
    let pid = backend_pid::<D>(&held).await;

    let locker = lock_row(&db, &stored(&login, &alice)).await;
    let what = "a call whose backend was killed";
    let call = limiter.failed(&login, &alice);
    let verdict = kill_while_it_waits_on_a_lock(&admin, pid, KILL_BUDGET, what, call).await;
    assert_shed(&verdict.unwrap(), what);
    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        counts(&db).await,
        BTreeMap::from([(stored(&login, &alice), 1)]),
        "the killed call counted nothing"
    );
    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.calls("login", "failed", "allowed"), 1);
    assert_eq!(recorded.calls("login", "failed", "shed"), 1);
    assert_eq!(recorded.calls("login", "failed", "unreachable"), 0);
    assert_eq!(recorded.calls("login", "failed", "error"), 0);
    assert_eq!(recorded.probes("up"), 1);
}

/// A pool of one whose connection is held elsewhere: load, so the call is
/// shed once the budget is spent, never allowed and never a hang; once the
/// connection is back, calls count again.
pub async fn an_exhausted_pool_is_shed_within_the_budget<D: Driver>() {
    let db = fresh_db().await;
    let pool = D::pool(&db.config(), 1).await;
    let limiter = Limiter::builder(Postgres::new(pool.clone()))
        .budget(BUDGET)
        .build()
        .unwrap();
    let login = limit("login", 3);
    let alice = Key::opaque("starved");

    let taken = D::take(&pool).await;
    let what = "an exhausted pool";
    let (verdict, took) = timed(BUDGET + SLACK, what, limiter.failed(&login, &alice)).await;
    assert_shed(&verdict.unwrap(), what);
    assert!(took >= BUDGET, "gave up early, after {took:?}");
    drop(taken);

    let (verdict, _) = timed(BUDGET + SLACK, "after", limiter.failed(&login, &alice)).await;
    assert_counted(&verdict.unwrap(), 1, "once the connection is back");
}
