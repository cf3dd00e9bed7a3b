//! The limiter through PgBouncer in transaction pooling mode, the pooler many
//! deployments put between their services and PostgreSQL.
//!
//! In transaction mode a client's transactions may each run on a different
//! server connection, and one server connection serves many clients in turn.
//! The limiter is built for that: each operation is one `CALL` in autocommit
//! (one transaction, as PgBouncer sees it), sent as an unnamed statement, and
//! its system switch is set for the limiter's own transaction only, so it
//! cannot be left on for the next client of the server connection.
//!
//! Without a `pgbouncer` binary these tests are skipped, except in CI (where
//! `CI` is set), which installs it.
//!
//! The tests' own queries use `query_typed` and the simple protocol: a named
//! prepared statement does not survive from one transaction to the next under
//! transaction pooling.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::common;
use common::bouncer::{Watching, fresh_db_with_scratch, observe, start_bouncer};
use common::db::{backend_pid, fresh_db, hold, lend};
use common::limit;
use platformkit_limit::{ErrorKind, Key, Limiter, Postgres, purge};
use platformkit_limit_testdb::{TestDb, connect};
use tokio_postgres::error::SqlState;

/// Rows in the table, counted by the superuser (who bypasses row-level
/// security) directly on the server.
async fn rows_in_table(db: &TestDb) -> i64 {
    db.connect_admin()
        .await
        .query_one("SELECT count(*) FROM platformkit.platformkit_limits", &[])
        .await
        .expect("counting the rows as the superuser")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_switch_never_leaks_to_the_next_client_of_the_server_connection() {
    // One server connection for limit_owner in the database: every client
    // below takes turns on it.
    let Some(bouncer) = start_bouncer(1) else {
        return;
    };
    let db = fresh_db().await;
    let config = bouncer.config_for(&db.config());

    let a = hold(&config).await;
    let held = Arc::new(Limiter::new(Postgres::new(lend(Arc::clone(&a)))));
    let per_call = Arc::new(Limiter::new(Postgres::new(config.clone())));
    let b = Arc::new(connect(&config).await);

    let server_pid = backend_pid(&*a.lock().await).await;
    assert_eq!(
        backend_pid(&b).await,
        server_pid,
        "with a pool of one, both clients must share the server connection"
    );
    observe(&b, server_pid).await;

    let login = limit("login", 1_000);
    let keys: Vec<Key> = (0..5).map(|i| Key::opaque(&format!("user-{i}"))).collect();

    // Concurrently: A's limiter calls and B's observations race for the
    // one server connection.
    let watching = Watching::start(Arc::clone(&b), server_pid);
    let rounds = watching.rounds();
    let calls = tokio::spawn({
        let (held, per_call, login, keys, rounds) = (
            Arc::clone(&held),
            Arc::clone(&per_call),
            login.clone(),
            keys.clone(),
            Arc::clone(&rounds),
        );
        async move {
            let before = rounds.load(Ordering::Relaxed);
            for i in 0..50 {
                let key = &keys[i % keys.len()];
                // Mostly the held client; every third call connects anew.
                let verdict = if i % 3 == 2 {
                    per_call.failed(&login, key).await
                } else {
                    held.failed(&login, key).await
                }
                .expect("failed through the bouncer");
                assert!(!verdict.is_unreachable());
                assert_eq!(verdict.count(), Some(i as u64 / keys.len() as u64 + 1));
            }
            rounds.load(Ordering::Relaxed) - before
        }
    });
    let interleaved = calls.await.expect("the limiter's task");
    watching.stop().await;
    assert!(
        interleaved > 0,
        "the observer never ran while the limiter did"
    );

    // Sequentially: each of A's calls is followed by B's observation.
    for (i, key) in keys.iter().cycle().take(20).enumerate() {
        let verdict = if i % 2 == 0 {
            held.check(&login, key).await
        } else {
            per_call.hit(&login, key).await
        }
        .expect("a call through the bouncer");
        assert!(verdict.is_allowed());
        observe(&b, server_pid).await;
    }
    held.reset(&login, &keys[0]).await.unwrap();
    observe(&b, server_pid).await;
    assert_eq!(purge(&config).await.unwrap(), 0);
    observe(&b, server_pid).await;

    // Every call ran on the one server connection and was counted.
    assert_eq!(backend_pid(&*a.lock().await).await, server_pid);
    for (i, key) in keys.iter().enumerate() {
        let count = held.check(&login, key).await.unwrap().count();
        // 10 failures and 2 hits each (the odd calls of the sequential
        // round), except key 0, which was reset.
        let expected = if i == 0 { 0 } else { 12 };
        assert_eq!(count, Some(expected), "count of user-{i}");
    }
    observe(&b, server_pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_inside_a_transaction_through_pgbouncer_is_refused_and_nothing_leaks() {
    let Some(bouncer) = start_bouncer(1) else {
        return;
    };
    let db = fresh_db_with_scratch().await;
    let config = bouncer.config_for(&db.config());
    let a = hold(&config).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&a))));
    let login = limit("login", 3);
    let alice = Key::opaque("alice");

    let server_pid = {
        let client = a.lock().await;
        client
            .batch_execute("BEGIN; INSERT INTO scratch VALUES (1)")
            .await
            .expect("opening A's transaction");
        backend_pid(&client).await
    };

    let error = limiter
        .failed(&login, &alice)
        .await
        .expect_err("a connection inside a transaction must be refused");
    assert_eq!(error.kind(), ErrorKind::InTransaction);
    assert_eq!(
        error.code(),
        Some(&SqlState::INVALID_TRANSACTION_TERMINATION)
    );

    // A's transaction was rolled back, so the server connection is free for
    // the next client, with nothing of A's behind.
    let b = connect(&config).await;
    let scratch: i64 = b
        .query_typed_one("SELECT count(*) FROM scratch", &[])
        .await
        .expect("counting the scratch rows")
        .get(0);
    assert_eq!(scratch, 0, "A's insert was committed");
    observe(&b, server_pid).await;
    assert_eq!(rows_in_table(&db).await, 0, "the failure was counted");

    // A is idle again, and the limiter works on it.
    {
        let client = a.lock().await;
        let scratch: i64 = client
            .query_typed_one("SELECT count(*) FROM scratch", &[])
            .await
            .expect("A is usable after the refusal")
            .get(0);
        assert_eq!(scratch, 0);
    }
    let verdict = limiter.failed(&login, &alice).await.unwrap();
    assert_eq!(verdict.count(), Some(1));
    observe(&b, server_pid).await;
}
