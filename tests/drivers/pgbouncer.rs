//! PgBouncer in transaction mode, one server connection shared with
//! another client who watches it between the limiter's calls.

use std::collections::BTreeMap;
use std::sync::Arc;

use platformkit_limit::{ErrorKind, Key, Limit, LimitConn, Limiter, Postgres, Reservation, purge};
use platformkit_limit_testdb::PgBouncer;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::driver::{Driver, Lend, hold, lend};
use super::{assert_counted, counts};
use crate::common::bouncer::{Watching, fresh_db_with_scratch, observe, start_bouncer};
use crate::common::db::{backend_pid, fresh_db, stored};
use crate::common::{LONG_WINDOW, limit};

/// Through PgBouncer in transaction mode with one server connection: every
/// operation works from a held connection and from the driver's own source,
/// taking turns with another client, who never sees the switch on or a row;
/// a limit reached through one source refuses through the other; purge
/// deletes a closed window; a connection inside a transaction is refused and
/// the next client finds nothing of it.
pub async fn every_operation_works_through_pgbouncer_on_either_driver<D: Driver>()
where
    Lend<D::Conn>: LimitConn,
{
    let Some(bouncer) = start_bouncer(1) else {
        return;
    };
    if D::PREPARES && !bouncer.carries_prepared_statements() {
        let (major, minor) = bouncer.version();
        eprintln!(
            "PgBouncer {major}.{minor} cannot carry named prepared statements: checked that \
             the limiter fails loudly through it; the full check needs PgBouncer 1.21 or newer"
        );
        fails_loudly_through_a_pgbouncer_without_prepared_statements::<D>(&bouncer).await;
        return;
    }
    let db = fresh_db_with_scratch().await;
    let config = bouncer.config_for(&db.config());
    let held = hold::<D>(&config).await;
    let on_held = Arc::new(
        Limiter::builder(Postgres::new(lend::<D>(&held)))
            .no_refusal_cache()
            .build()
            .expect("valid settings"),
    );
    let source = Arc::new(
        Limiter::builder(Postgres::new(D::source(&config)))
            .no_refusal_cache()
            .build()
            .expect("valid settings"),
    );
    let observer = Arc::new(platformkit_limit_testdb::connect(&config).await);
    let server_pid = backend_pid(&observer).await;
    observe(&observer, server_pid).await;

    let login = limit("login", 1_000);
    let keys: Vec<Key> = (0..4).map(|i| Key::opaque(&format!("user-{i}"))).collect();

    // Concurrently: the limiter's calls and the observer race for the one
    // server connection.
    let watching = Watching::start(Arc::clone(&observer), server_pid);
    for i in 0..40 {
        let key = &keys[i % keys.len()];
        let verdict = if i % 3 == 2 {
            source.failed(&login, key).await
        } else {
            on_held.failed(&login, key).await
        }
        .unwrap_or_else(|e| panic!("call {i} through the bouncer: {e:?}"));
        assert_counted(
            &verdict,
            i as u64 / keys.len() as u64 + 1,
            "through the bouncer",
        );
    }
    assert!(watching.stop().await > 0, "the observer never ran");

    // Each operation, each followed by the observer.
    each_operation_then_observe(&on_held, &login, &keys, &observer, server_pid).await;
    each_operation_then_observe(&source, &login, &keys, &observer, server_pid).await;
    on_held.reset(&login, &keys[0]).await.unwrap();
    observe(&observer, server_pid).await;

    // A limit reached through one source refuses through the other.
    let tight = limit("tight", 1);
    assert_counted(&on_held.failed(&tight, &keys[0]).await.unwrap(), 1, "tight");
    let refused = source.failed(&tight, &keys[0]).await.unwrap();
    assert!(refused.is_refused(), "{refused:?}");
    assert_counted(&refused, 2, "tight, refused");
    assert!(
        refused
            .retry_after()
            .is_some_and(|wait| wait <= LONG_WINDOW)
    );
    on_held.reset(&tight, &keys[0]).await.unwrap();
    observe(&observer, server_pid).await;

    // purge: a window that closed two days ago (as the limiter's own
    // transaction would write it) goes, and nothing else.
    D::simple(
        &mut *held.lock().await,
        "BEGIN;
         SELECT pg_catalog.set_config('platformkit.system', 'on', true);
         INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
         VALUES ('login|old', now() - interval '3 days', now() - interval '2 days', 5);
         COMMIT;",
    )
    .await
    .expect("planting a closed window");
    observe(&observer, server_pid).await;
    assert_eq!(purge(&lend::<D>(&held)).await.unwrap(), 1);
    observe(&observer, server_pid).await;
    assert_eq!(purge(&lend::<D>(&held)).await.unwrap(), 0);
    observe(&observer, server_pid).await;
    assert_counted(&source.check(&login, &keys[0]).await.unwrap(), 0, "reset");
    assert_counted(
        &source.check(&login, &keys[1]).await.unwrap(),
        12,
        "counted",
    );

    // A held connection inside a transaction: refused, rolled back, and the
    // server connection free for the next client with nothing behind.
    D::simple(
        &mut *held.lock().await,
        "BEGIN; INSERT INTO scratch VALUES (1)",
    )
    .await
    .unwrap();
    let err = on_held
        .failed(&login, &keys[3])
        .await
        .expect_err("a connection inside a transaction gave a verdict");
    assert_eq!(err.kind(), ErrorKind::InTransaction, "{err:?}");
    let scratch: i64 = observer
        .query_typed_one("SELECT count(*) FROM scratch", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(scratch, 0, "the caller's insert was committed");
    observe(&observer, server_pid).await;
    assert_counted(&on_held.check(&login, &keys[3]).await.unwrap(), 12, "after");
}

/// Through a PgBouncer older than 1.21, which cannot carry named prepared
/// statements from one server connection to the next, a driver that
/// prepares them (sqlx, for every query it binds) cannot work: two clients
/// of one server connection both name their first statement `sqlx_s_1`.
/// Then every call either counts or is a hard error (`Query`, with the
/// server's SQLSTATE), never an allow; the other client of the server
/// connection never sees the switch on or a row; and what the table holds is
/// exactly what the calls counted. (tokio-postgres through `Prepared` names
/// its statements uniquely within the process, so its clients do not
/// collide on the one server connection: there every call counts.)
async fn fails_loudly_through_a_pgbouncer_without_prepared_statements<D: Driver>(
    bouncer: &PgBouncer,
) where
    Lend<D::Conn>: LimitConn,
{
    let db = fresh_db().await;
    let config = bouncer.config_for(&db.config());
    let held = hold::<D>(&config).await;
    let on_held = Limiter::builder(Postgres::new(lend::<D>(&held)))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let source = Limiter::builder(Postgres::new(D::source(&config)))
        .no_refusal_cache()
        .build()
        .expect("valid settings");
    let observer = platformkit_limit_testdb::connect(&config).await;
    let server_pid = backend_pid(&observer).await;
    let login = limit("login", 1_000);
    let alice = Key::opaque("alice");

    let (mut counted, mut refused) = (0, 0);
    for i in 0..20 {
        let result = if i % 2 == 0 {
            on_held.failed(&login, &alice).await
        } else {
            source.failed(&login, &alice).await
        };
        match result {
            Ok(verdict) => {
                counted += 1;
                assert_counted(&verdict, counted, "a call that went through");
            }
            Err(e) => {
                refused += 1;
                assert_eq!(e.kind(), ErrorKind::Query, "call {i}: {e:?}");
                assert!(
                    [
                        SqlState::DUPLICATE_PSTATEMENT,
                        SqlState::INVALID_SQL_STATEMENT_NAME,
                        SqlState::PROTOCOL_VIOLATION,
                    ]
                    .iter()
                    .any(|code| e.code() == Some(code)),
                    "call {i}: {e:?}"
                );
            }
        }
        observe(&observer, server_pid).await;
    }
    if D::NAMES_PER_CONNECTION {
        assert!(
            refused > 0,
            "two clients of one server connection did not collide"
        );
    } else {
        assert_eq!(refused, 0, "statements named uniquely collided");
    }
    assert_eq!(
        counts(&db).await,
        BTreeMap::from([(stored(&login, &alice), counted as i64)])
    );
}

/// check, hit, hit_all and a reserve taken back, each followed by the
/// observer's look at the one server connection.
async fn each_operation_then_observe<C: LimitConn>(
    limiter: &Limiter<Postgres<C>>,
    login: &Limit,
    keys: &[Key],
    observer: &Client,
    server_pid: i32,
) {
    assert_counted(&limiter.check(login, &keys[0]).await.unwrap(), 10, "check");
    observe(observer, server_pid).await;
    assert!(limiter.hit(login, &keys[1]).await.unwrap().is_allowed());
    observe(observer, server_pid).await;
    let pairs = [(login, &keys[2]), (login, &keys[3])];
    assert!(limiter.hit_all(&pairs).await.unwrap().is_allowed());
    observe(observer, server_pid).await;
    match limiter.reserve(login, &keys[0]).await.unwrap() {
        Reservation::Granted(permit) => permit.succeeded().await.unwrap(),
        Reservation::Refused(verdict) => panic!("refused: {verdict:?}"),
    }
    observe(observer, server_pid).await;
}
