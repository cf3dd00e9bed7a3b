//! With the `tracing` feature, every unreachable outcome is a warning event
//! and a purge that succeeded an info event; they name the limit and the
//! cause, never the key. A per-address rule without a client address is an
//! error event naming the limit and the fix, and so is a wrong tier.
//!
//! Its own test binary: `tracing` caches each call site's interest in a
//! subscriber, and a test elsewhere in the same process touching the same
//! call sites with no subscriber installed can race that cache.
#![cfg(feature = "tracing")]

use std::time::Duration;

use platformkit_limit::{Key, Limit, Limiter, Postgres, SCHEMA};
use platformkit_limit_testdb::Server;
use platformkit_limit_testdb::events::Seen;

#[test]
fn unreachable_outcomes_are_warnings_and_a_purge_is_info_without_the_key() {
    let seen = Seen::during(|_| async {
        let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let db = Server::shared().database(SCHEMA).await;
        // A fresh config: adding a port to one that has one would be
        // a configuration error, not an unreachable server.
        let mut closed = tokio_postgres::Config::new();
        closed.host("127.0.0.1").port(nowhere).user("limit_owner");
        let limiter = Limiter::builder(Postgres::new(closed))
            .budget(Duration::from_millis(500))
            .build()
            .expect("a budget");
        let limit = Limit::new("login", 3, Duration::from_secs(60)).expect("a limit");
        let key = Key::email("secret-alice@example.com");
        let verdict = limiter.failed(&limit, &key).await.expect("a verdict");
        assert!(verdict.is_unreachable());
        // A limit that refuses when the store is unreachable is said to
        // refuse, never to allow.
        let strict = Limit::builder("strict", 3, Duration::from_secs(60))
            .when_unreachable(platformkit_limit::WhenUnreachable::Refuse)
            .build()
            .expect("a limit");
        let verdict = limiter.failed(&strict, &key).await.expect("a verdict");
        assert!(verdict.is_unreachable() && verdict.is_refused());
        platformkit_limit::purge(&db.config())
            .await
            .expect("a purge");
    })
    .events();
    let warnings: Vec<&String> = seen
        .iter()
        .filter(|(level, _)| *level == tracing::Level::WARN)
        .map(|(_, fields)| fields)
        .collect();
    let unreachable = warnings
        .iter()
        .find(|f| f.contains("fail-open"))
        .expect("a warning for the unreachable outcome");
    assert!(unreachable.contains("limit=\"login\""), "{unreachable}");
    assert!(
        unreachable.contains("operation=\"failed\""),
        "{unreachable}"
    );
    assert!(unreachable.contains("cause="), "{unreachable}");
    let refused = warnings
        .iter()
        .find(|f| f.contains("limit=\"strict\""))
        .expect("a warning for the strict limit");
    assert!(
        refused.contains("attempt refused") && !refused.contains("allowed"),
        "{refused}"
    );
    assert!(
        !warnings.iter().any(|f| f.contains("purged")),
        "a successful purge is a warning: {warnings:?}"
    );
    assert!(
        seen.iter()
            .any(|(level, f)| *level == tracing::Level::INFO && f.contains("purged")),
        "no info event for the purge: {seen:?}"
    );
    for (_, fields) in &seen {
        assert!(
            !fields.contains("secret-alice"),
            "an event shows the key: {fields}"
        );
    }
}

/// The newcomer's mistake: a per-address rule in front of a router served
/// without `into_make_service_with_connect_info`. The first request is
/// answered 500, and an error event names the rule's limit and the fix.
#[test]
fn a_per_address_rule_without_a_client_address_is_an_error_event_naming_the_limit_and_the_fix() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use platformkit_limit_tower::LimitLayer;
    use tower::ServiceExt as _;

    let seen = Seen::during(|_| async {
        let db = Server::shared().database(SCHEMA).await;
        let limiter = Limiter::new(Postgres::new(db.config()));
        let per_address =
            Limit::new("login-address", 3, Duration::from_secs(900)).expect("a limit");
        let app = axum::Router::new()
            .route("/login", axum::routing::post(|| async { "welcome" }))
            .layer(LimitLayer::hit(limiter).limit_per_client_ip(&per_address));
        let request = Request::post("/login")
            .body(Body::empty())
            .expect("a request");
        let answer = app.oneshot(request).await.expect("infallible");
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
    })
    .events();
    let event = the_one_error_event(&seen);
    assert!(event.contains("limit=\"login-address\""), "{event}");
    for fix in [
        "into_make_service_with_connect_info::<SocketAddr>()",
        "ClientIp",
        "trusted proxy",
    ] {
        assert!(event.contains(fix), "{fix} missing from {event}");
    }
}

/// A tier that is not the rule's limit under another max: answered 500,
/// and an error event names the rule's limit and the fix.
#[test]
fn a_wrong_tier_is_an_error_event_naming_the_limit_and_the_fix() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use platformkit_limit::Memory;
    use platformkit_limit_tower::LimitLayer;
    use tower::ServiceExt as _;

    let seen = Seen::during(|_| async {
        let limiter = Limiter::new(Memory::new());
        let api = Limit::new("api", 3, Duration::from_secs(60)).expect("a limit");
        let other = Limit::new("api", 100, Duration::from_secs(3600)).expect("a limit");
        let layer = LimitLayer::hit(limiter)
            .limit(&api, |_: &_| Some(Key::opaque("client-9")))
            .tier(&api, move |_: &_| Some(other.clone()));
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "hello" }))
            .layer(layer);
        let request = Request::get("/").body(Body::empty()).expect("a request");
        let answer = app.oneshot(request).await.expect("infallible");
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
    })
    .events();
    let event = the_one_error_event(&seen);
    assert!(event.contains("limit=\"api\""), "{event}");
    assert!(event.contains("Limit::with_max"), "{event}");
    assert!(
        !event.contains("client-9"),
        "an event shows the key: {event}"
    );
}

/// The one error event of a run that sent one request answered 500.
fn the_one_error_event(seen: &[(tracing::Level, String)]) -> &str {
    let errors: Vec<&String> = seen
        .iter()
        .filter(|(level, _)| *level == tracing::Level::ERROR)
        .map(|(_, fields)| fields)
        .collect();
    let [event] = errors[..] else {
        panic!("one error event for the one request, not {seen:?}");
    };
    event
}
