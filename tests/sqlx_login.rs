//! The sqlx example, run against the harness's server over a pool of one
//! connection: the service's own query and the limiter share it, so the
//! limiter needs no second pool.

#[path = "../examples/sqlx_login.rs"]
#[allow(dead_code, reason = "the example's main is not used here")]
mod example;

use std::time::Duration;

use example::Attempt;
use platformkit_limit::SCHEMA;
use platformkit_limit_testdb::Server;
use sqlx::postgres::PgPoolOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlx_example_limits_logins_over_the_services_own_pool() {
    let db = Server::shared().database(SCHEMA).await;
    // One connection: the example's own queries and the limiter's calls take
    // turns on it, and the pool never opens a second.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&db.url())
        .await
        .expect("a pool of one");

    let attempts = example::demo(pool.clone()).await.expect("the demo");
    assert_eq!(attempts.len(), 5);
    assert_eq!(attempts[0], Attempt::SignedIn, "a good password");
    assert_eq!(
        attempts[1..4],
        [
            Attempt::WrongPassword,
            Attempt::WrongPassword,
            Attempt::WrongPassword
        ],
        "three wrong passwords"
    );
    let Attempt::Refused(wait) = attempts[4] else {
        panic!(
            "the good password after three wrong ones: {:?}",
            attempts[4]
        );
    };
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_secs(15 * 60),
        "{wait:?}"
    );
    assert_eq!(
        pool.size(),
        1,
        "the pool opened more than its one connection"
    );

    // The three failures are one row, read as the superuser.
    let row = db
        .connect_admin()
        .await
        .query_one("SELECT key, count FROM platformkit.platformkit_limits", &[])
        .await
        .expect("one row");
    assert_eq!(row.get::<_, String>(0), "login|email|alice@example.com");
    assert_eq!(row.get::<_, i64>(1), 3);
}
