//! The pool adapters, against real PostgreSQL: a deadpool or bb8 pool is a
//! connection source, an exhausted pool still ends within the budget, a
//! connection goes back to the pool idle, not inside a transaction, and a
//! deadpool pool through `Prepared` prepares each statement once per
//! connection (and nothing without it).
#![cfg(all(feature = "deadpool", feature = "bb8"))]

use std::time::Duration;

use crate::common;
use common::db::backend_pid;
use common::{BUDGET, SLACK, timed};
use platformkit_limit::driver::Prepared;
use platformkit_limit::{ErrorKind, Key, Limit, LimitConn, Limiter, Postgres, SCHEMA};
use platformkit_limit_testdb::{Server, TestDb};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

fn deadpool(db: &TestDb, size: usize) -> deadpool_postgres::Pool {
    let manager = deadpool_postgres::Manager::new(db.config(), NoTls);
    deadpool_postgres::Pool::builder(manager)
        .max_size(size)
        .build()
        .expect("a deadpool pool")
}

async fn bb8(db: &TestDb, size: u32) -> bb8::Pool<bb8_postgres::PostgresConnectionManager<NoTls>> {
    let manager = bb8_postgres::PostgresConnectionManager::new(db.config(), NoTls);
    bb8::Pool::builder()
        .max_size(size)
        .build(manager)
        .await
        .expect("a bb8 pool")
}

/// The state PostgreSQL reports for a backend: `idle`, `idle in
/// transaction`, `active`…
async fn backend_state(db: &TestDb, pid: i32) -> String {
    let admin = db.connect_admin().await;
    admin
        .query_one("SELECT state FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .expect("the backend is there")
        .get(0)
}

/// Two limiters over one single-connection pool share one limit, and the
/// connection is idle (not in a transaction) between calls.
async fn a_pool_is_a_connection_source<C: LimitConn>(db: &TestDb, pool: C, pid: i32) {
    let limit = Limit::new("pool", 2, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("pooled");
    let limiter = Limiter::new(Postgres::new(pool));
    assert!(
        limiter
            .failed(&limit, &key)
            .await
            .expect("failed")
            .is_allowed()
    );
    assert_eq!(backend_state(db, pid).await, "idle");
    let verdict = limiter.failed(&limit, &key).await.expect("failed");
    assert!(verdict.is_refused());
    assert!(!verdict.is_unreachable());
    assert_eq!(backend_state(db, pid).await, "idle");
    assert_eq!(
        limiter.check(&limit, &key).await.expect("check").count(),
        Some(2)
    );
    assert_eq!(backend_state(db, pid).await, "idle");
}

/// With the pool's only connection held elsewhere, a call ends within the
/// budget, shed: the server answers the probe (bb8's dedicated connection).
/// (For deadpool and sqlx, `tests/drivers/faults.rs`:
/// `an_exhausted_pool_is_shed_within_the_budget`.)
async fn an_exhausted_pool_ends_within_the_budget<C: LimitConn>(pool: C) {
    let limit = Limit::new("pool", 2, Duration::from_secs(60)).expect("a limit");
    let limiter = Limiter::builder(Postgres::new(pool))
        .budget(BUDGET)
        .build()
        .expect("a budget");
    let starved = Key::opaque("starved");
    let (verdict, took) = timed(
        BUDGET + SLACK,
        "exhausted",
        limiter.failed(&limit, &starved),
    )
    .await;
    let verdict = verdict.expect("a verdict");
    assert!(verdict.is_refused() && verdict.is_shed(), "{verdict:?}");
    assert_eq!(
        verdict.shed().map(|e| e.kind()),
        Some(ErrorKind::Overloaded)
    );
    assert!(took >= BUDGET, "gave up early, after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadpool_pool_is_a_connection_source_and_gets_its_connection_back_idle() {
    let db = Server::shared().database(SCHEMA).await;
    let pool = deadpool(&db, 1);
    let pid = backend_pid(&pool.get().await.expect("a connection")).await;
    a_pool_is_a_connection_source(&db, pool, pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bb8_pool_is_a_connection_source_and_gets_its_connection_back_idle() {
    let db = Server::shared().database(SCHEMA).await;
    let pool = bb8(&db, 1).await;
    let pid = backend_pid(&pool.get().await.expect("a connection")).await;
    a_pool_is_a_connection_source(&db, pool, pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_bb8_pool_ends_within_the_budget() {
    let db = Server::shared().database(SCHEMA).await;
    let pool = bb8(&db, 1).await;
    let _held = pool.get_owned().await.expect("the only connection");
    an_exhausted_pool_ends_within_the_budget(pool.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_inside_a_transaction_is_refused_and_handed_back_idle() {
    let db = Server::shared().database(SCHEMA).await;
    let pool = deadpool(&db, 1);
    let pid: i32 = {
        let conn = pool.get().await.expect("a connection");
        conn.batch_execute("CREATE TABLE caller_work (x int)")
            .await
            .expect("a table");
        // Leave the pooled connection inside a transaction with work in it.
        conn.batch_execute("BEGIN; INSERT INTO caller_work VALUES (1)")
            .await
            .expect("caller work");
        backend_pid(&conn).await
    };
    let limit = Limit::new("pool", 2, Duration::from_secs(60)).expect("a limit");
    let limiter = Limiter::new(Postgres::new(pool.clone()));
    let error = limiter
        .failed(&limit, &Key::opaque("k"))
        .await
        .expect_err("a connection inside a transaction is an error");
    assert_eq!(error.kind(), ErrorKind::InTransaction);
    assert_eq!(backend_state(&db, pid).await, "idle");
    let conn = pool.get().await.expect("the connection");
    let rows: i64 = conn
        .query_one("SELECT count(*) FROM caller_work", &[])
        .await
        .expect("a count")
        .get(0);
    assert_eq!(rows, 0, "the caller's work was not committed");
}

/// The limiter's statements prepared on the pooled connection `conn`, each
/// with how many times it was planned or its plan reused (PostgreSQL counts
/// both for a `SELECT`, neither for a `CALL`).
async fn prepared_statements(conn: &deadpool_postgres::Object) -> Vec<(String, i64)> {
    // (query_typed: an unnamed statement, so the look prepares nothing.)
    conn.query_typed(
        "SELECT statement, generic_plans + custom_plans FROM pg_catalog.pg_prepared_statements \
         WHERE statement LIKE '%platformkit.platformkit_limit_%' ORDER BY statement",
        &[],
    )
    .await
    .expect("pg_prepared_statements")
    .iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_deadpool_pool_prepares_each_statement_once_per_connection() {
    let db = Server::shared().database(SCHEMA).await;
    let pool = deadpool(&db, 1);
    let limit = Limit::new("prepared", 4, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("prepared");
    let limiter = Limiter::builder(Postgres::new(Prepared(pool.clone())))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    for n in 1..=6u64 {
        let failed = limiter.failed(&limit, &key).await.expect("failed");
        assert_eq!(failed.count(), Some(n));
        let checked = limiter.check(&limit, &key).await.expect("check");
        assert_eq!(checked.count(), Some(n));
    }
    let conn = pool.get().await.expect("the one connection");
    let prepared = prepared_statements(&conn).await;
    let statements: Vec<&str> = prepared.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(statements.len(), 2, "{prepared:?}");
    assert!(statements[0].starts_with("CALL platformkit.platformkit_limit_add("));
    assert!(statements[1].starts_with("SELECT platformkit.platformkit_limit_read("));
    assert_eq!(
        prepared[1].1, 6,
        "the read, prepared once and run six times"
    );
    assert_eq!(conn.statement_cache.size(), 2);
    assert_eq!(backend_state(&db, backend_pid(&conn).await).await, "idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadpool_pool_prepares_nothing_by_default() {
    let db = Server::shared().database(SCHEMA).await;
    let pool = deadpool(&db, 1);
    let limit = Limit::new("unnamed", 4, Duration::from_secs(60)).expect("a limit");
    let limiter = Limiter::new(Postgres::new(pool.clone()));
    limiter
        .failed(&limit, &Key::opaque("unnamed"))
        .await
        .expect("failed");
    limiter
        .check(&limit, &Key::opaque("unnamed"))
        .await
        .expect("check");
    let conn = pool.get().await.expect("the one connection");
    assert_eq!(prepared_statements(&conn).await, []);
}

/// `DEALLOCATE ALL` behind the cache: the next call is a hard error with
/// the server's SQLSTATE, counting nothing; the one after prepares again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_deallocated_behind_the_cache_fails_once_then_is_prepared_again() {
    let db = Server::shared().database(SCHEMA).await;
    let pool = deadpool(&db, 1);
    let limit = Limit::new("deallocated", 4, Duration::from_secs(60)).expect("a limit");
    let key = Key::opaque("deallocated");
    let limiter = Limiter::builder(Postgres::new(Prepared(pool.clone())))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    assert_eq!(
        limiter.failed(&limit, &key).await.expect("failed").count(),
        Some(1)
    );
    {
        let conn = pool.get().await.expect("the one connection");
        conn.batch_execute("DEALLOCATE ALL")
            .await
            .expect("deallocated");
    }
    let error = limiter
        .failed(&limit, &key)
        .await
        .expect_err("a hard error");
    assert_eq!(error.kind(), ErrorKind::Query);
    assert_eq!(error.code(), Some(&SqlState::INVALID_SQL_STATEMENT_NAME));
    assert_eq!(
        limiter.failed(&limit, &key).await.expect("failed").count(),
        Some(2)
    );
    let conn = pool.get().await.expect("the one connection");
    assert_eq!(prepared_statements(&conn).await.len(), 1);
}
