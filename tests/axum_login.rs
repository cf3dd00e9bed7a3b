//! The axum example service, started on a loopback port and driven over real
//! HTTP: 401 then 429 with Retry-After on logins, `hit` on password/forgot,
//! code guesses limited on password/reset, and `/metrics` serving what the
//! limiter counted.

#[path = "../examples/axum_login.rs"]
#[allow(dead_code, reason = "the example's main is not used here")]
mod axum_login;

use std::sync::Arc;

use platformkit_limit::SCHEMA;
use platformkit_limit_testdb::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: String,
}

/// One HTTP/1.1 request on its own connection.
async fn send(address: std::net::SocketAddr, method: &str, path: &str, form: &str) -> Answer {
    let mut stream = TcpStream::connect(address)
        .await
        .expect("the service listens");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("a request");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("an answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let retry_after = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("retry-after"))
        .map(|(_, value)| value.trim().parse().expect("whole seconds"));
    Answer {
        status,
        retry_after,
        body: body.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_axum_service_limits_logins_resets_and_codes_over_http() {
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

    // Login: five wrong passwords; the fifth failure closes the window.
    let wrong = "email=Alice%40Example.com&password=guess";
    for attempt in 1..=4 {
        let answer = send(address, "POST", "/login", wrong).await;
        assert_eq!(answer.status, 401, "attempt {attempt}: {}", answer.body);
        assert_eq!(answer.retry_after, None);
    }
    let fifth = send(address, "POST", "/login", wrong).await;
    assert_eq!(fifth.status, 429);
    // Refused from now on, even with the right password, and the other
    // spelling of the address is the same account.
    let right = "email=alice%40example.com&password=correct+horse+battery+staple";
    let refused = send(address, "POST", "/login", right).await;
    assert_eq!(refused.status, 429);
    let wait = refused.retry_after.expect("a Retry-After header");
    assert!((1..=15 * 60).contains(&wait), "Retry-After {wait}");
    // Another account is not affected.
    let bob = "email=bob%40example.com&password=correct+horse+battery+staple";
    assert_eq!(send(address, "POST", "/login", bob).await.status, 200);

    // Password/forgot: every ask counts, three an hour.
    for ask in 1..=3 {
        let answer = send(
            address,
            "POST",
            "/password/forgot",
            "email=carol%40example.com",
        )
        .await;
        assert_eq!(answer.status, 202, "ask {ask}");
    }
    let fourth = send(
        address,
        "POST",
        "/password/forgot",
        "email=carol%40example.com",
    )
    .await;
    assert_eq!(fourth.status, 429);
    assert!(fourth.retry_after.is_some());

    // Password/reset: five wrong codes, then even the right one is refused.
    for guess in 1..=4 {
        let answer = send(
            address,
            "POST",
            "/password/reset",
            "email=dan%40example.com&code=000000",
        )
        .await;
        assert_eq!(answer.status, 401, "guess {guess}");
    }
    let fifth = send(
        address,
        "POST",
        "/password/reset",
        "email=dan%40example.com&code=000001",
    )
    .await;
    assert_eq!(fifth.status, 429);
    let right = send(
        address,
        "POST",
        "/password/reset",
        "email=dan%40example.com&code=424242",
    )
    .await;
    assert_eq!(
        right.status, 429,
        "the right code after the limit is refused too"
    );
    // A flood of tries at the refused key: from the third refusal within a
    // second, this process answers it without a round trip.
    for again in 1..=2 {
        let answer = send(
            address,
            "POST",
            "/password/reset",
            "email=dan%40example.com&code=424242",
        )
        .await;
        assert_eq!(answer.status, 429, "try {again} after the refusal");
    }

    // The metrics the limiter counted, served as Prometheus text.
    let exposition = send(address, "GET", "/metrics", "").await;
    assert_eq!(exposition.status, 200);
    for line in [
        r#"platformkit_limit_calls_total{limit="login",operation="failed",outcome="allowed",source="store"} 4"#,
        r#"platformkit_limit_calls_total{limit="login",operation="failed",outcome="refused",source="store"} 1"#,
        r#"platformkit_limit_calls_total{limit="password-forgot",operation="hit",outcome="refused",source="store"} 1"#,
        r#"platformkit_limit_calls_total{limit="password-reset-code",operation="failed",outcome="refused",source="store"} 1"#,
    ] {
        assert!(
            exposition.body.contains(line),
            "missing {line} in\n{}",
            exposition.body
        );
    }
    // The fifth wrong code was refused by the store, and so was the next try
    // (a single refusal is never cached). The third refusal within a second
    // makes the key flooded, and the try after it is refused without a
    // round trip: unless this machine took more than a second between those
    // requests, when it asks the store too (the cache's timing itself is
    // tested on a pinned clock in tests/refusal_cache.rs).
    let refused_checks = |source: &str| -> u64 {
        let series = format!(
            r#"platformkit_limit_calls_total{{limit="password-reset-code",operation="check",outcome="refused",source="{source}"}} "#
        );
        exposition
            .body
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .map_or(0, |n| n.trim().parse().expect("a count"))
    };
    let (store, cache) = (refused_checks("store"), refused_checks("cache"));
    assert!(
        (store, cache) == (2, 1) || (store, cache) == (3, 0),
        "the right code's refusals: {store} from the store, {cache} from the cache, in\n{}",
        exposition.body
    );
    assert!(
        exposition
            .body
            .contains("platformkit_limit_call_duration_seconds_bucket{"),
        "the duration is a histogram with buckets"
    );
    assert!(!exposition.body.contains("alice"), "no key in the metrics");
}
