//! A misconfiguration is an error, never an allow: a missing schema, table
//! or privilege, and a session `statement_timeout` shorter than the budget,
//! which would let the server cancel calls the limiter has not given up on.

use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::db::{assert_idle, fresh_db, hold, lend, system_switch};
use common::limit;
use platformkit_limit::{ErrorKind, Key, Limiter, Postgres};
use platformkit_limit_testdb::Server;
use tokio_postgres::error::SqlState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_table_or_privilege_is_an_error_not_an_allow() {
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");

    // No schema at all: the limiter's schema and procedures are missing.
    let empty = Server::shared().empty_database().await;
    let held = hold(&empty.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    for verdict in [
        limiter.check(&login, &alice).await,
        limiter.failed(&login, &alice).await,
        limiter.hit(&login, &alice).await,
    ] {
        let err = verdict.expect_err("a missing schema gave a verdict");
        assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
        assert_eq!(err.code(), Some(&SqlState::INVALID_SCHEMA_NAME));
        assert!(!err.is_unreachable());
    }
    let err = limiter.reset(&login, &alice).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
    assert_idle(&*held.lock().await).await;

    // The procedures without their table: the statement fails inside the
    // limiter's transaction, with the system switch already on.
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("DROP TABLE platformkit.platformkit_limits")
        .await
        .unwrap();
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    for verdict in [
        limiter.check(&login, &alice).await,
        limiter.failed(&login, &alice).await,
        limiter.hit(&login, &alice).await,
    ] {
        let err = verdict.expect_err("a missing table gave a verdict");
        assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
        assert_eq!(err.code(), Some(&SqlState::UNDEFINED_TABLE));
        assert!(!err.is_unreachable());
    }
    {
        let client = held.lock().await;
        assert_idle(&client).await;
        let switch = system_switch(&client).await;
        assert!(matches!(switch.as_deref(), None | Some("")), "{switch:?}");
    }

    // The table without the grants the limiter needs.
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("REVOKE ALL ON platformkit.platformkit_limits FROM limit_tenant")
        .await
        .unwrap();
    let limiter = Limiter::new(Postgres::new(db.tenant_config()));
    let err = limiter
        .failed(&login, &alice)
        .await
        .expect_err("a missing privilege gave a verdict");
    assert_eq!(err.kind(), ErrorKind::Query, "{err:?}");
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
}

/// A session `statement_timeout` shorter than the budget would let the
/// server cancel a call the limiter has not given up on; a role default
/// (`ALTER ROLE app SET statement_timeout = '1ms'`) would make every replica
/// fail open. It is refused as a misconfiguration before anything is done.
/// The budget is long, so that the longest timeout cannot fire before the
/// procedure's check, however slow a shared machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_statement_timeout_shorter_than_the_budget_is_a_misconfiguration_never_an_allow()
{
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::builder(Postgres::new(lend(Arc::clone(&held))))
        .budget(Duration::from_secs(30))
        .build()
        .expect("a budget");
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );
    for timeout in ["1ms", "5s", "20s"] {
        held.lock()
            .await
            .batch_execute(&format!("SET statement_timeout = '{timeout}'"))
            .await
            .unwrap();
        for result in [
            limiter.check(&login, &alice).await,
            limiter.failed(&login, &alice).await,
        ] {
            let err = result.expect_err("a short statement_timeout gave a verdict");
            assert!(!err.is_unreachable(), "{timeout}: {err:?}");
            if timeout != "20s" {
                // The server may stop the call before the procedure reaches
                // its check (under 1ms at once, under 5s on a loaded
                // machine): a cancel the limiter did not send, as hard.
                assert!(
                    matches!(err.kind(), ErrorKind::Misconfigured | ErrorKind::Cancelled),
                    "{err:?}"
                );
            } else {
                assert_eq!(err.kind(), ErrorKind::Misconfigured, "{timeout}: {err:?}");
                assert_eq!(err.code(), Some(&SqlState::from_code("PK001")));
            }
        }
        assert_idle(&*held.lock().await).await;
    }

    // Longer than the budget: the limiter gives up first, so it is no
    // concern of the procedure's.
    held.lock()
        .await
        .batch_execute("SET statement_timeout = '1min'")
        .await
        .unwrap();
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(2),
        "a refused call counted, or a long timeout was refused"
    );
}
