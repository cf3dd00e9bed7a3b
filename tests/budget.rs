//! The server's side of the budget, on tokio-postgres: the server's part of
//! it ends before the client's, for a held connection and for a connection
//! per call alike, so a row lock held past it is a hard error (never an
//! allow) and nothing of the limiter's is left waiting on the lock; and a
//! cancel the limiter did not send is a `Cancelled` error, never taken for
//! the budget running out. What every driver must do on a held lock or a
//! slow call is in `tests/drivers/budget.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common;
use common::db::{
    assert_idle, assert_no_lock_waits_soon, counts_by_key, fresh_db, hold, lock_row, lock_row_from,
    on_held, one_i64, stored, system_switch, until_a_call_waits_on_a_lock, visible_rows,
};
use common::metrics::Recorded;
use common::{BUDGET, SLACK, limit, pinned_clock, timed};
use metrics_util::debugging::DebuggingRecorder;
use platformkit_limit::{ErrorKind, Key, Limit, Limiter, Postgres};
use tokio_postgres::error::SqlState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// The server's part of the budget ends before the client's: a lock held
/// past it ends the wait on the server, as a hard error (never an allow),
/// and nothing of the limiter's is left waiting.
async fn the_server_stops_waiting_on_a_held_lock_before_the_client_gives_up() {
    let db = fresh_db().await;
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    let admin = db.connect_admin().await;

    let held = hold(&db.config()).await;
    let on_held = on_held(&held, BUDGET);
    let per_call = Limiter::builder(Postgres::new(db.config()))
        .budget(BUDGET)
        .build()
        .unwrap();
    assert_eq!(
        on_held.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    // The lock is held for the rest of the test: far longer than the budget.
    let locker = lock_row(&db, &stored(&login, &alice)).await;

    for (name, on_held_connection) in [("held connection", true), ("per call", false)] {
        let call = async {
            if on_held_connection {
                on_held.failed(&login, &alice).await
            } else {
                per_call.failed(&login, &alice).await
            }
        };
        let (result, _) = timed(BUDGET + SLACK, name, call).await;
        let err = result.expect_err("a held lock gave a verdict");
        assert_eq!(err.kind(), ErrorKind::LockTimeout, "{name}: {err:?}");
        assert!(!err.is_unreachable(), "{name}");

        // The server gave up too: nothing of the limiter's waits on the lock.
        assert_no_lock_waits_soon(&admin, name).await;
    }

    // The held connection is usable, idle, and the switch is off on it.
    {
        let client = held.lock().await;
        assert!(!client.is_closed());
        assert_eq!(
            one_i64(&client, "SELECT 1::int8", &[]).await,
            1,
            "the connection answers"
        );
        assert_idle(&client).await;
        assert_ne!(
            system_switch(&client).await.as_deref(),
            Some("on"),
            "the system switch outlived the limiter's transaction"
        );
        assert_eq!(visible_rows(&client).await, 0);
    }

    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        counts_by_key(&admin).await,
        BTreeMap::from([(stored(&login, &alice), 1)]),
        "the calls that gave up counted nothing"
    );
    // And once the lock is gone, the same connection counts again.
    assert_eq!(
        on_held.failed(&login, &alice).await.unwrap().count(),
        Some(2)
    );
}

// ---------------------------------------------------------------------------
// A cancel the limiter did not send
// ---------------------------------------------------------------------------

/// Red-team 6.9 and F5: another session of the application's role cancelled
/// a limiter call waiting on a lock; the 57014 it got read as the budget
/// running out, so the store counted as unreachable and the attempt went
/// through uncounted. Now a cancel this call did not send is an error.
#[tokio::test]
async fn a_cancel_the_limiter_did_not_send_is_an_error_never_an_allow() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let db = fresh_db().await;
    // A long budget: the limiter's own lock timeout and cancel come long
    // after the stranger's cancel.
    let limiter = Limiter::builder(Postgres::new(db.tenant_config()).with_clock(pinned_clock()))
        .budget(Duration::from_secs(10))
        .no_refusal_cache()
        .build()
        .unwrap();
    let login = Limit::new("login", 5, Duration::from_secs(3600)).unwrap();
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    // Another session of the application's role holds the row, with the
    // switch on.
    let locker = lock_row_from(db.connect_tenant().await, &stored(&login, &alice)).await;

    // A third session of the same role cancels the limiter's waiting call.
    let admin = db.connect_admin().await;
    let canceller = db.connect_tenant().await;
    let cancel = async {
        let pid = until_a_call_waits_on_a_lock(&admin, Duration::from_secs(8)).await;
        let cancelled: bool = canceller
            .query_one("SELECT pg_catalog.pg_cancel_backend($1)", &[&pid])
            .await
            .unwrap()
            .get(0);
        assert!(cancelled, "pg_cancel_backend refused");
    };
    let (result, ()) = tokio::join!(limiter.failed(&login, &alice), cancel);

    let err = result.expect_err("a cancelled call gave a verdict");
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
    assert_eq!(err.code(), Some(&SqlState::QUERY_CANCELED));
    assert!(!err.is_unreachable(), "{err:?}");
    locker.batch_execute("ROLLBACK").await.unwrap();

    let next = limiter.failed(&login, &alice).await.unwrap();
    assert_eq!(
        next.count(),
        Some(2),
        "the cancelled failure was counted, or the next was not"
    );

    let calls = Recorded::take(&snapshotter).calls;
    let failed = |outcome: &str| {
        calls
            .get(&("login".to_owned(), "failed".to_owned(), outcome.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(failed("unreachable"), 0, "{calls:?}");
    assert_eq!(failed("error"), 1, "{calls:?}");
    assert_eq!(failed("allowed"), 2, "{calls:?}");
}

/// A backend that stops answering (here: stopped with `SIGSTOP`, as a stuck
/// or starved process is) while the server still takes the limiter's cancel
/// request is a server that is up and too slow: the call is shed, never let
/// through as unreachable, although nothing else was answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_backend_whose_server_takes_the_cancel_is_shed_never_allowed() {
    let server = tokio::task::spawn_blocking(|| {
        platformkit_limit_testdb::Server::start(platformkit_limit_testdb::Options::default())
    })
    .await
    .expect("a server of its own");
    let db = server.database(platformkit_limit::SCHEMA).await;
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    let held = hold(&db.config()).await;
    let limiter = on_held(&held, BUDGET);
    // Answered once: the store knows the server and its round trip.
    let first = limiter.failed(&login, &alice).await.expect("a verdict");
    assert_eq!(first.count(), Some(1));

    let pid = common::db::backend_pid(&*held.lock().await).await;
    let signal = |which: &str| {
        let status = std::process::Command::new("kill")
            .args([which, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {which} {pid}");
    };
    signal("-STOP");
    let (verdict, _) = timed(BUDGET + SLACK, "stopped", limiter.failed(&login, &alice)).await;
    signal("-CONT");
    let verdict = verdict.expect("a verdict, not an error");
    common::assert_shed(
        &verdict,
        "a stopped backend behind a server that took the cancel",
    );
}
