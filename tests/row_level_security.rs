//! Row-level security and the system switch: every table is under
//! row-level security or exempt on purpose (and the check can fail); no
//! ordinary role, the table's owner included, can see, add, change or
//! delete a row outside the limiter; and the switch never outlives the
//! limiter's transaction, not through a prepared transaction or a savepoint
//! rolled back, so a purge written as plain SQL deletes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::common;
use common::db::{
    assert_idle, counts_by_key, fresh_db, hold, lend, one_i64, stored, stored_rows, system_switch,
    texts, visible_rows,
};
use common::limit;
use platformkit_limit::{Key, Limit, Limiter, Postgres, SCHEMA, purge};
use platformkit_limit_testdb::{Server, TestDb};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

/// Tables in schemas `public` and `platformkit` that may stay outside
/// row-level security, each with the reason. None today: every table of the
/// crate holds keys.
const EXEMPT: &[(&str, &str)] = &[];

/// Tables in schemas `public` and `platformkit` without row-level security
/// enabled *and* forced *and* at least one policy, less the [`EXEMPT`] ones.
async fn unscoped_tables(client: &Client) -> Vec<String> {
    client
        .query(
            "SELECT c.relname::text
             FROM pg_catalog.pg_class AS c
             JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
             WHERE n.nspname IN ('public', 'platformkit')
               AND c.relkind IN ('r', 'p')
               AND NOT (c.relrowsecurity
                        AND c.relforcerowsecurity
                        AND EXISTS (SELECT 1 FROM pg_catalog.pg_policy AS p
                                    WHERE p.polrelid = c.oid))
             ORDER BY 1",
            &[],
        )
        .await
        .expect("listing tables")
        .iter()
        .map(|row| row.get::<_, String>(0))
        .filter(|table| !EXEMPT.iter().any(|(exempt, _)| exempt == table))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_table_is_scoped_or_exempt_on_purpose() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'platformkit' \
             AND tablename = 'platformkit_limits'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        tables, 1,
        "the schema creates platformkit_limits in schema platformkit"
    );
    assert_eq!(unscoped_tables(&client).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scope_check_finds_an_unscoped_table() {
    let db = Server::shared().empty_database().await;
    let client = db.connect().await;
    client.batch_execute(SCHEMA).await.unwrap();
    client
        .batch_execute("CREATE TABLE scratch_unscoped (x int)")
        .await
        .unwrap();
    assert_eq!(unscoped_tables(&client).await, ["scratch_unscoped"]);

    client
        .batch_execute(
            "CREATE TABLE scratch_not_forced (x int);
             ALTER TABLE scratch_not_forced ENABLE ROW LEVEL SECURITY;
             CREATE POLICY p ON scratch_not_forced USING (false);
             CREATE TABLE scratch_no_policy (x int);
             ALTER TABLE scratch_no_policy ENABLE ROW LEVEL SECURITY;
             ALTER TABLE scratch_no_policy FORCE ROW LEVEL SECURITY;",
        )
        .await
        .unwrap();
    assert_eq!(
        unscoped_tables(&client).await,
        [
            "scratch_no_policy",
            "scratch_not_forced",
            "scratch_unscoped"
        ]
    );

    // In the crate's own schema too, where its table is.
    client
        .batch_execute("CREATE TABLE platformkit.scratch_beside (x int)")
        .await
        .unwrap();
    assert_eq!(
        unscoped_tables(&client).await,
        [
            "scratch_beside",
            "scratch_no_policy",
            "scratch_not_forced",
            "scratch_unscoped"
        ]
    );
}

/// With a row the limiter wrote, `client` (outside the limiter's transaction)
/// can neither see, add, change nor delete a row.
async fn assert_out_of_reach(db: &TestDb, client: &Client, login: &Limit, key: &Key) {
    let key = stored(login, key);
    assert_eq!(stored_rows(db).await, [(key.clone(), 2)]);

    let seen: i64 = client
        .query_one("SELECT count(*) FROM platformkit.platformkit_limits", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 0, "SELECT saw the limiter's rows");
    let is_system: bool = client
        .query_one("SELECT platformkit.platformkit_is_system()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!is_system);

    let insert = client
        .execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             VALUES ('login|forged', now(), now() + interval '1 hour', 0)",
            &[],
        )
        .await
        .expect_err("INSERT went through row-level security");
    assert_eq!(
        insert.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{insert:?}"
    );
    assert!(
        insert
            .as_db_error()
            .is_some_and(|e| e.message().contains("row-level security")),
        "refused for another reason than row-level security: {insert:?}"
    );

    let updated = client
        .execute(
            "UPDATE platformkit.platformkit_limits SET count = 0 WHERE key = $1",
            &[&key],
        )
        .await
        .unwrap();
    assert_eq!(updated, 0, "UPDATE reached the limiter's row");
    let deleted = client
        .execute("DELETE FROM platformkit.platformkit_limits", &[])
        .await
        .unwrap();
    assert_eq!(deleted, 0, "DELETE reached the limiter's row");

    assert_eq!(stored_rows(db).await, [(key, 2)], "the row changed");

    // The limit's definition, recorded by the limiter, is as far out of reach.
    let limiter = Limiter::new(Postgres::new(db.config()));
    limiter.record([login]).await.unwrap();
    let defs = "platformkit.platformkit_limit_defs";
    let seen: i64 = client
        .query_one(&format!("SELECT count(*) FROM {defs}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 0, "SELECT saw the recorded limits");
    let insert = client
        .execute(
            &format!(
                "INSERT INTO {defs} (name, max, window_secs, sliding, lockout_secs)                  VALUES ('forged', 1, 60, false, 0)"
            ),
            &[],
        )
        .await
        .expect_err("INSERT of a definition went through row-level security");
    assert!(
        insert
            .as_db_error()
            .is_some_and(|e| e.message().contains("row-level security")),
        "{insert:?}"
    );
    for change in [
        format!("UPDATE {defs} SET max = 1000000"),
        format!("DELETE FROM {defs}"),
    ] {
        assert_eq!(client.execute(&change, &[]).await.unwrap(), 0, "{change}");
    }
    // The audit too: an unlock's entry, written by the limiter, is out of
    // reach, and nobody outside the limiter writes one.
    limiter
        .unlock(login, &Key::opaque("nobody"), "ann", "a test")
        .await
        .unwrap();
    let audit = "platformkit.platformkit_limit_audit";
    let seen: i64 = client
        .query_one(&format!("SELECT count(*) FROM {audit}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 0, "SELECT saw the audit");
    let forged = client
        .execute(
            &format!(
                "INSERT INTO {audit} (by, action, key, reason) VALUES ('x', 'unlock', 'k', 'y')"
            ),
            &[],
        )
        .await
        .expect_err("INSERT into the audit went through row-level security");
    assert!(
        forged
            .as_db_error()
            .is_some_and(|e| e.message().contains("row-level security")),
        "{forged:?}"
    );
    for change in [
        format!("UPDATE {audit} SET by = 'y'"),
        format!("DELETE FROM {audit}"),
    ] {
        assert_eq!(client.execute(&change, &[]).await.unwrap(), 0, "{change}");
    }
    assert_eq!(limiter.audit(None, 10).await.unwrap().len(), 1);
    assert_eq!(limiter.limits().await.unwrap(), std::slice::from_ref(login));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owning_role_cannot_reach_the_rows_outside_the_limiter() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    limiter.failed(&login, &alice).await.unwrap();
    limiter.failed(&login, &alice).await.unwrap();

    let owner = db.connect().await;
    assert_out_of_reach(&db, &owner, &login, &alice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_role_cannot_reach_the_rows_outside_the_limiter() {
    let db = fresh_db().await;
    // The limiter connects as the application role: its grants are enough.
    let limiter = Limiter::new(Postgres::new(db.tenant_config()));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    limiter.failed(&login, &alice).await.unwrap();
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(2)
    );

    let tenant = db.connect_tenant().await;
    assert_out_of_reach(&db, &tenant, &login, &alice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_switch_does_not_outlive_the_limiter_transaction() {
    let db = fresh_db().await;
    let held = hold(&db.config()).await;
    let limiter = Limiter::new(Postgres::new(lend(Arc::clone(&held))));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");

    for call in ["failed", "hit", "check", "reset"] {
        match call {
            "failed" => drop(limiter.failed(&login, &alice).await.unwrap()),
            "hit" => drop(limiter.hit(&login, &alice).await.unwrap()),
            "check" => drop(limiter.check(&login, &alice).await.unwrap()),
            _ => drop(limiter.reset(&login, &alice).await.unwrap()),
        }
        let client = held.lock().await;
        let switch = system_switch(&client).await;
        assert!(
            matches!(switch.as_deref(), None | Some("")),
            "after {call}, the switch reads {switch:?}"
        );
        assert_idle(&client).await;
        if call != "reset" {
            let seen: i64 = client
                .query_one("SELECT count(*) FROM platformkit.platformkit_limits", &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(seen, 0, "after {call}, the session sees the rows");
        }
    }
}

// ---------------------------------------------------------------------------
// The system switch cannot be kept on
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_or_savepoint_rollback_cannot_keep_the_switch_on() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.config()));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    assert_eq!(
        limiter.failed(&login, &alice).await.unwrap().count(),
        Some(1)
    );

    let owner = db.connect().await;
    assert_eq!(visible_rows(&owner).await, 0);

    // A prepared transaction: the switch was on inside it, and is off for the
    // session once it is prepared, and after it is committed.
    let prepared: i64 = one_i64(
        &owner,
        "SELECT current_setting('max_prepared_transactions')::int8",
        &[],
    )
    .await;
    assert!(
        prepared > 0,
        "this test needs max_prepared_transactions > 0 (throwaway servers have 10)"
    );
    let gid = format!("switch_{}", db.name());
    owner
        .batch_execute("BEGIN; SELECT set_config('platformkit.system', 'on', true)")
        .await
        .unwrap();
    assert_eq!(visible_rows(&owner).await, 1, "the switch is on inside");
    owner
        .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
        .await
        .unwrap();
    assert_ne!(system_switch(&owner).await.as_deref(), Some("on"));
    assert_eq!(visible_rows(&owner).await, 0, "after PREPARE TRANSACTION");
    owner
        .batch_execute(&format!("COMMIT PREPARED '{gid}'"))
        .await
        .expect("COMMIT PREPARED");
    assert_ne!(system_switch(&owner).await.as_deref(), Some("on"));
    assert_eq!(visible_rows(&owner).await, 0, "after COMMIT PREPARED");
    assert_idle(&owner).await;

    // A savepoint rolled back takes the switch with it.
    owner
        .batch_execute("BEGIN; SAVEPOINT s; SET LOCAL platformkit.system = 'on'")
        .await
        .unwrap();
    assert_eq!(
        visible_rows(&owner).await,
        1,
        "the switch is on in the savepoint"
    );
    owner
        .batch_execute("ROLLBACK TO SAVEPOINT s")
        .await
        .unwrap();
    assert_ne!(system_switch(&owner).await.as_deref(), Some("on"));
    assert_eq!(visible_rows(&owner).await, 0, "after ROLLBACK TO SAVEPOINT");
    owner.batch_execute("COMMIT").await.unwrap();
    assert_eq!(visible_rows(&owner).await, 0, "after COMMIT");

    // A purge written as plain SQL, outside the limiter, deletes nothing; the
    // limiter's purge does.
    let admin = db.connect_admin().await;
    admin
        .batch_execute(
            "INSERT INTO platformkit.platformkit_limits (key, window_start, window_end, count)
             VALUES ('login|old', now() - interval '3 days', now() - interval '2 days', 4)",
        )
        .await
        .unwrap();
    let deleted = owner
        .execute(
            "DELETE FROM platformkit.platformkit_limits WHERE window_end < now() - interval '24 hours'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(deleted, 0, "a plain-SQL purge deleted rows");
    let deleted = owner
        .execute("DELETE FROM platformkit.platformkit_limits", &[])
        .await
        .unwrap();
    assert_eq!(deleted, 0, "a plain-SQL DELETE deleted rows");
    assert_eq!(
        counts_by_key(&admin).await,
        BTreeMap::from([("login|old".to_owned(), 4), (stored(&login, &alice), 1)])
    );
    assert_eq!(purge(&db.config()).await.unwrap(), 1);
    assert_eq!(
        counts_by_key(&admin).await,
        BTreeMap::from([(stored(&login, &alice), 1)])
    );
}

/// The policy's function names every built-in with its schema, so a
/// `current_setting` that answers "on" and an `=` that answers true, in a
/// schema of the application's role ahead of pg_catalog on its
/// search_path, open nothing: the function is inlined into the policy, and
/// still reads the real setting with the real operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_setting_and_an_equals_ahead_of_pg_catalog_do_not_open_the_policy() {
    let db = fresh_db().await;
    let limiter = Limiter::new(Postgres::new(db.tenant_config()));
    let login = limit("login", 5);
    let alice = Key::email("alice@example.com");
    limiter.failed(&login, &alice).await.unwrap();
    limiter.failed(&login, &alice).await.unwrap();

    db.connect_admin()
        .await
        .batch_execute("CREATE SCHEMA AUTHORIZATION limit_tenant")
        .await
        .expect("a schema owned by limit_tenant");
    let tenant = db.connect_tenant().await;
    tenant
        .batch_execute(
            "CREATE FUNCTION limit_tenant.current_setting(text, boolean) RETURNS text
                 LANGUAGE sql AS $$ SELECT 'on' $$;
             CREATE FUNCTION limit_tenant.yes(text, text) RETURNS boolean
                 LANGUAGE sql AS $$ SELECT true $$;
             CREATE OPERATOR limit_tenant.= (
                 LEFTARG = text, RIGHTARG = text, FUNCTION = limit_tenant.yes);
             SET search_path = limit_tenant, pg_catalog, public;",
        )
        .await
        .expect("the planted built-ins");
    let planted: bool = tenant
        .query_one(
            "SELECT current_setting('platformkit.system', true) = 'off'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(planted, "the planted objects are live in this session");

    assert_out_of_reach(&db, &tenant, &login, &alice).await;
}

/// The policy's function has no `SET` clause, so PostgreSQL inlines it: the
/// plan of a statement on the table evaluates the setting itself, once, and
/// never calls the function (which would switch the settings around each
/// call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_function_is_inlined_into_the_plan() {
    let db = fresh_db().await;
    let tenant = db.connect_tenant().await;
    let plan = texts(
        &tenant,
        "EXPLAIN (VERBOSE, COSTS OFF) SELECT count(*) FROM platformkit.platformkit_limits",
    )
    .await
    .join("\n");
    assert!(plan.contains("current_setting"), "{plan}");
    assert!(!plan.contains("platformkit_is_system"), "{plan}");
}
