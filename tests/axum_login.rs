//! The deadpool axum example, started on a loopback port and driven over
//! real HTTP: 401 then 429 with `Retry-After` on logins, the account's other
//! spellings counted as one, and `/metrics` serving what the limiter
//! counted.
//!
//! Its own test binary: the example installs the global Prometheus recorder,
//! which a process has one of, and the test reads exact counts from it.

#[path = "../examples/axum_login.rs"]
#[allow(dead_code, reason = "the example's main is not used here")]
mod axum_login;
mod common;

use std::sync::Arc;

use platformkit_limit::SCHEMA;
use platformkit_limit_testdb::Server;

use crate::common::http::send;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_axum_service_limits_logins_over_http() {
    let db = Server::shared().database(SCHEMA).await;
    let manager = deadpool_postgres::Manager::new(db.config(), tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(4)
        .build()
        .expect("a pool");
    let app = Arc::new(axum_login::App::new(pool, axum_login::install_metrics()).expect("limits"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, axum_login::router(app)).await });

    // Five wrong passwords; the fifth failure closes the window.
    let wrong = "email=Alice%40Example.com&password=guess";
    for attempt in 1..=4 {
        let answer = send(address, "POST", "/login", &[], wrong).await;
        assert_eq!(answer.status, 401, "attempt {attempt}: {}", answer.body);
        assert_eq!(answer.retry_after(), None);
    }
    let fifth = send(address, "POST", "/login", &[], wrong).await;
    assert_eq!(fifth.status, 429);
    // Refused from now on, even with the right password, and the other
    // spelling of the address is the same account.
    let right = "email=alice%40example.com&password=correct+horse+battery+staple";
    let refused = send(address, "POST", "/login", &[], right).await;
    assert_eq!(refused.status, 429);
    let wait = refused.retry_after().expect("a Retry-After header");
    assert!((1..=15 * 60).contains(&wait), "Retry-After {wait}");
    // Another account is not affected.
    let bob = "email=bob%40example.com&password=correct+horse+battery+staple";
    assert_eq!(send(address, "POST", "/login", &[], bob).await.status, 200);

    // The metrics the limiter counted, served as Prometheus text.
    let exposition = send(address, "GET", "/metrics", &[], "").await;
    assert_eq!(exposition.status, 200);
    for line in [
        r#"platformkit_limit_calls_total{limit="login",operation="failed",outcome="allowed",source="store"} 4"#,
        r#"platformkit_limit_calls_total{limit="login",operation="failed",outcome="refused",source="store"} 1"#,
        r#"platformkit_limit_calls_total{limit="login",operation="check",outcome="refused",source="store"} 1"#,
    ] {
        assert!(
            exposition.body.contains(line),
            "missing {line} in\n{}",
            exposition.body
        );
    }
    assert!(!exposition.body.contains("alice"), "no key in the metrics");
}
