//! The caller's transaction stays the caller's. That a connection handed
//! over inside a transaction (plain, serializable, read-only or failed) is an
//! error, with nothing of that transaction committed, is tested on every
//! driver in `tests/drivers/callers_transaction.rs`. Here, on tokio-postgres:
//! caller code that wrote before calling a procedure (a DO block, a procedure
//! of its own, an extended-protocol pipeline) is refused, and its write is
//! not committed.
//! And nothing of the limiter's transaction runs on into the caller's code
//! after the call: no switch, no rows, no lock.
//!
//! The attacks on the procedures are those of the schema red-team report
//! (sections 2 and 6), run as the application's role, `limit_tenant`.

use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::db::{fresh_db, hold, lend, refused, stored_windows, system_switch};
use common::wire::{Answer, Wire};
use common::{limit, pinned_clock};
use platformkit_limit::{ErrorKind, Key, Limit, Limiter, Postgres};
use platformkit_limit_testdb::TestDb;
use tokio_postgres::error::SqlState;

// ---------------------------------------------------------------------------
// Caller code around the procedures' CALL
// ---------------------------------------------------------------------------

/// A fresh database with the schema and `public.caller_work(x int)`, a table
/// of the application's that `limit_tenant` may write.
async fn db_with_caller_work() -> TestDb {
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("CREATE TABLE public.caller_work (x int)")
        .await
        .expect("creating caller_work as the owner");
    db
}

/// The rows of `caller_work`, read by the tenant.
async fn caller_work(db: &TestDb) -> Vec<i32> {
    db.connect_tenant()
        .await
        .query("SELECT x FROM public.caller_work ORDER BY x", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Red-team 2.9 and 2.10: called from a DO block or a procedure of the
/// caller's that had written, the limiter's leading COMMIT committed the
/// caller's work, and the caller's later failure could not take it back.
/// Now the CALL is refused (2D000) and the caller's work goes with its
/// failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_code_that_wrote_before_the_call_is_refused_and_its_work_is_not_committed() {
    let db = db_with_caller_work().await;
    let tenant = db.connect_tenant().await;

    let (code, message) = refused(
        tenant
            .batch_execute(
                "DO $$
                 DECLARE d bigint;
                 BEGIN
                     INSERT INTO public.caller_work VALUES (1);
                     CALL platformkit.platformkit_limit_reset(
                         p_key => 'k', p_budget_ms => 2000, p_relaxed => false, o_deleted => d);
                     RAISE EXCEPTION 'the caller fails after the call';
                 END
                 $$",
            )
            .await,
        "a DO block that wrote, then called",
    );
    assert_eq!(code, SqlState::INVALID_TRANSACTION_TERMINATION, "{message}");
    assert_eq!(
        caller_work(&db).await,
        Vec::<i32>::new(),
        "the DO block's write was committed"
    );

    tenant
        .batch_execute(
            "CREATE PROCEDURE pg_temp.caller() LANGUAGE plpgsql AS $$
             DECLARE d bigint;
             BEGIN
                 INSERT INTO public.caller_work VALUES (2);
                 CALL platformkit.platformkit_limit_reset(
                     p_key => 'k', p_budget_ms => 2000, p_relaxed => false, o_deleted => d);
                 RAISE EXCEPTION 'the caller fails after the call';
             END
             $$",
        )
        .await
        .unwrap();
    let (code, message) = refused(
        tenant.batch_execute("CALL pg_temp.caller()").await,
        "a procedure that wrote, then called",
    );
    assert_eq!(code, SqlState::INVALID_TRANSACTION_TERMINATION, "{message}");
    assert_eq!(
        caller_work(&db).await,
        Vec::<i32>::new(),
        "the procedure's write was committed"
    );
}

/// What the caller's code after the CALL records of its own transaction:
/// the transaction and table locks it holds (read in a statement of its
/// own, before a statement that names the table takes one), the switch, and
/// the rows it can see.
const OBSERVE: &str = "
    SELECT count(*) INTO locks FROM pg_catalog.pg_locks AS l
    WHERE l.pid = pg_catalog.pg_backend_pid()
      AND (l.locktype = 'transactionid'
           OR (l.locktype = 'relation'
               AND l.relation = 'platformkit.platformkit_limits'::regclass));
    INSERT INTO pg_temp.observed
    SELECT locks, coalesce(pg_catalog.current_setting('platformkit.system', true), ''),
           (SELECT count(*) FROM platformkit.platformkit_limits);";

/// The limiter's add, as caller code writes it in PL/pgSQL (at 10:30 UTC).
const ADD_IN_PLPGSQL: &str = "
    CALL platformkit.platformkit_limit_add(
        p_key => 'login|k', p_add => 1, p_window_secs => 3600,
        p_at => 1767263400000000,
        p_budget_ms => 2000, p_relaxed => false, p_previous => false, p_max => 5,
        p_lockout_secs => 0, o_count => c, o_window_end => we, o_now => nw,
        o_previous => pv, o_locked_for => lu, o_commit_us => cw);";

/// Red-team 2.9, 2.10 and 6.4: after a CALL from a DO block or a procedure
/// of the caller's, the caller's code ran on inside the limiter's system
/// transaction: the switch on, every row visible and writable, the row lock
/// held until the caller's block ended. Now the caller's code after the
/// CALL sees the switch off, no rows, and holds no lock of the limiter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_code_after_the_call_sees_no_switch_no_rows_and_holds_no_lock_of_the_limiters() {
    let db = db_with_caller_work().await;
    let tenant = db.connect_tenant().await;
    // Rows to see, had the switch stayed on.
    let limiter = Limiter::new(Postgres::new(db.tenant_config()).with_clock(pinned_clock()));
    let login = Limit::new("login", 5, Duration::from_secs(3600)).unwrap();
    limiter
        .failed(&login, &Key::email("alice@example.com"))
        .await
        .unwrap();
    tenant
        .batch_execute(&format!(
            "CREATE TEMP TABLE observed (locks bigint, switch text, rows bigint);
             CREATE PROCEDURE pg_temp.caller() LANGUAGE plpgsql AS $$
             DECLARE c bigint; we bigint; nw bigint; pv bigint; lu bigint; cw bigint; locks bigint;
             BEGIN
                 {ADD_IN_PLPGSQL}
                 {OBSERVE}
             END
             $$;"
        ))
        .await
        .unwrap();

    tenant
        .batch_execute(&format!(
            "DO $$
             DECLARE c bigint; we bigint; nw bigint; pv bigint; lu bigint; cw bigint; locks bigint;
             BEGIN
                 {ADD_IN_PLPGSQL}
                 {OBSERVE}
             END
             $$"
        ))
        .await
        .expect("a DO block that calls, then reads");
    tenant
        .batch_execute("CALL pg_temp.caller()")
        .await
        .expect("a procedure that calls, then reads");

    let observed: Vec<(i64, String, i64)> = tenant
        .query("SELECT locks, switch, rows FROM pg_temp.observed", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(
        observed,
        [(0, String::new(), 0), (0, String::new(), 0)],
        "(locks held, switch, rows visible) after the CALL in a DO block, then in a procedure"
    );
    assert_eq!(system_switch(&tenant).await.unwrap_or_default(), "");
    // Both calls counted.
    let stored = stored_windows(&db).await;
    assert!(
        stored
            .iter()
            .any(|(key, _, count)| key == "login|k" && *count == 2),
        "{stored:?}"
    );
}

/// Red-team 2.11: in an extended-protocol pipeline, a write before the CALL
/// and before the Sync was committed by the limiter's COMMIT, though the
/// pipeline failed. Now the CALL is refused and the write is not committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_write_before_the_call_is_refused_and_not_committed() {
    let db = db_with_caller_work().await;
    let mut wire = Wire::connect(&db.tenant_config()).await;

    let (answers, status) = wire
        .pipeline(&[
            "INSERT INTO public.caller_work VALUES (7)",
            "CALL platformkit.platformkit_limit_reset(\
             p_key => 'k', p_budget_ms => 2000, p_relaxed => false)",
            "SELECT 1/0",
        ])
        .await;
    assert_eq!(answers[0], Answer::Rows(vec![]), "the INSERT ran");
    match &answers[1] {
        Answer::Error(code, _) => assert_eq!(code, "2D000", "{answers:?}"),
        other => panic!("the CALL inside the pipeline's transaction was not refused: {other:?}"),
    }
    assert_eq!(answers[2], Answer::Skipped);
    assert_eq!(status, b'I', "the pipeline left a transaction open");
    assert_eq!(
        caller_work(&db).await,
        Vec::<i32>::new(),
        "row 7 was committed"
    );
}

/// Red-team 2.11: in a pipeline, the statements after the CALL and before
/// the Sync ran inside the limiter's system transaction, switch on, and read
/// every row. Now they see the switch off and no rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_statement_after_the_call_sees_no_switch_and_no_rows() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.tenant_config()).with_clock(pinned_clock()));
    let login = Limit::new("login", 5, Duration::from_secs(3600)).unwrap();
    limiter
        .failed(&login, &Key::email("alice@example.com"))
        .await
        .unwrap();
    let mut wire = Wire::connect(&db.tenant_config()).await;

    let (answers, status) = wire
        .pipeline(&[
            // The answer's second element is the count.
            "SELECT (platformkit.platformkit_limit_read(p_key => 'login|email|alice@example.com', \
             p_window_secs => 3600, p_at => 1767263400000000, p_budget_ms => 2000, \
             p_previous => false, p_max => 5, p_lockout_secs => 0))[2]",
            "SELECT coalesce(pg_catalog.current_setting('platformkit.system', true), ''), \
             (SELECT count(*) FROM platformkit.platformkit_limits)",
        ])
        .await;
    match &answers[0] {
        Answer::Rows(rows) => assert_eq!(rows[0][0].as_deref(), Some("1"), "{answers:?}"),
        other => panic!("the CALL failed: {other:?}"),
    }
    assert_eq!(
        answers[1],
        Answer::Rows(vec![vec![Some(String::new()), Some("0".to_owned())]]),
        "(switch, rows visible) after the CALL, before the Sync"
    );
    assert_eq!(status, b'I');
}

/// A read needs no transaction of its own: `check` on a connection inside
/// the caller's READ COMMITTED transaction reads the current count, writes
/// nothing, and hands the transaction back as it was: still open, with the
/// switch off and the caller's settings as the caller set them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_inside_the_callers_read_committed_transaction_reads_and_leaves_it_as_it_was() {
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    limiter.failed(&login, &alice).await.unwrap();
    held.lock()
        .await
        .batch_execute("CREATE TABLE caller_work (x int)")
        .await
        .unwrap();
    held.lock()
        .await
        .batch_execute("BEGIN; INSERT INTO caller_work VALUES (1); SET LOCAL lock_timeout = '7s';")
        .await
        .unwrap();

    // Another replica counts a failure meanwhile: the read sees it.
    Limiter::new(Postgres::new(db.config()))
        .failed(&login, &alice)
        .await
        .unwrap();
    let verdict = limiter.check(&login, &alice).await.unwrap();
    assert_eq!(verdict.count(), Some(2));

    let client = held.lock().await;
    let row = client
        .query_one(
            "SELECT pg_catalog.current_setting('lock_timeout'), \
                    pg_catalog.current_setting('search_path'), \
                    (SELECT count(*) FROM caller_work)",
            &[],
        )
        .await
        .unwrap();
    let (lock_timeout, search_path, work): (String, String, i64) =
        (row.get(0), row.get(1), row.get(2));
    assert_eq!(lock_timeout, "7s", "the caller's lock_timeout was changed");
    assert_eq!(search_path, "\"$user\", public");
    assert_eq!(work, 1, "the caller's own work is gone");
    let switch = system_switch(&client).await;
    assert!(matches!(switch.as_deref(), None | Some("")), "{switch:?}");
    client.batch_execute("ROLLBACK").await.unwrap();
    let kept: i64 = client
        .query_one("SELECT count(*) FROM caller_work", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 0, "the read committed the caller's work");
}

/// Inside a caller's REPEATABLE READ transaction the snapshot is the
/// transaction's: once it is older than 100 ms a read could miss counts
/// made since, so it is refused as a connection inside a transaction, never
/// answered from an old count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_inside_an_old_repeatable_read_transaction_is_refused_never_stale() {
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    held.lock()
        .await
        .batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1; SELECT pg_catalog.pg_sleep(0.2);",
        )
        .await
        .unwrap();
    let err = limiter
        .check(&login, &alice)
        .await
        .expect_err("an old snapshot gave a verdict");
    assert_eq!(err.kind(), ErrorKind::InTransaction, "{err:?}");
    assert!(!err.is_unreachable());
    assert_eq!(err.code(), Some(&SqlState::INVALID_TRANSACTION_TERMINATION));
}
