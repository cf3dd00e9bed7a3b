//! A newcomer's first hour with the README's example, exactly as README.md
//! writes it, over HTTP against a PostgreSQL server of the test's own: the
//! service starts on an empty database, wrong passwords are refused after
//! the limit, the database stops (the attempt is let through, and a
//! warning says so with no set-up beyond a subscriber), the database comes
//! back, and support unlocks the account.

mod common;

use axum::http::header;
use common::{GOOD, WRONG, as_a_new_role, post_login, refused_after_five_wrong};
use platformkit_limit_testdb::events::Seen;
use platformkit_limit_testdb::{Options, Server};

include!(concat!(env!("OUT_DIR"), "/readme_example.rs"));

#[test]
fn a_newcomers_first_hour_start_refuse_outage_and_unlock() {
    // The subscriber the service already has; nothing else is set up.
    Seen::during(|seen| async move { first_hour(&seen).await });
}

async fn first_hour(seen: &Seen) {
    let server = Server::start(Options::default());
    let db = server.empty_database().await;
    let (_role, pool) = as_a_new_role(&db).await;
    let service = app(pool.clone()).await.expect("the service starts");

    // Bad logins, then the limit.
    let alice = Some("alice@example.com");
    let refused = refused_after_five_wrong(&service, "alice@example.com", GOOD).await;
    let retry_after: u64 = refused.headers()[header::RETRY_AFTER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("whole seconds");
    // The window is clock-aligned: what is left of the current 15 minutes.
    assert!((1..=15 * 60).contains(&retry_after), "{retry_after}");
    assert!(
        seen.at(tracing::Level::WARN).is_empty(),
        "nothing to warn of yet: {:?}",
        seen.events()
    );

    // The database stops. The login is let through (the default), and the
    // service's log says so, naming the limit and never the account.
    server.pg_ctl(&["stop", "-m", "fast", "-w"]);
    let during = post_login(&service, Some("carol@example.com"), WRONG).await;
    assert_eq!(
        during.status(),
        StatusCode::UNAUTHORIZED,
        "fail-open reaches the handler"
    );
    let warnings = seen.at(tracing::Level::WARN);
    let fail_open = warnings
        .iter()
        .find(|w| w.contains("fail-open"))
        .unwrap_or_else(|| panic!("no warning for the fail-open: {:?}", seen.events()));
    assert!(fail_open.contains("limit=\"login\""), "{fail_open}");
    assert!(!fail_open.contains("carol"), "{fail_open}");

    // The database is back; within one probe interval (a second) calls
    // count again, and alice is still locked out until support acts.
    server.pg_ctl(&["start", "-w"]);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let still = post_login(&service, alice, GOOD).await;
    assert_eq!(still.status(), StatusCode::TOO_MANY_REQUESTS);

    // Support unlocks alice: the limit of the same name, and her key.
    let support = Limiter::new(Postgres::new(pool));
    let login = Limit::new("login", 5, Duration::from_secs(15 * 60)).expect("a limit");
    support
        .reset(&login, &Key::email("Alice@Example.com "))
        .await
        .expect("unlocked");
    let welcome = post_login(&service, alice, GOOD).await;
    assert_eq!(
        welcome.status(),
        StatusCode::OK,
        "alice signs in after the unlock"
    );
}

/// The warning above needs no feature of the service's choosing: `tracing`
/// is one of the crate's default features. (`cargo test --all-features`
/// turns every feature on, so the test above alone cannot tell.)
#[test]
fn the_events_are_a_default_feature() {
    let manifest = include_str!("../../Cargo.toml");
    let default = manifest
        .lines()
        .find(|line| line.starts_with("default = "))
        .expect("a default feature list");
    assert!(default.contains("\"tracing\""), "{default}");
}
