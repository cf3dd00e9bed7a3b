//! The sqlx + axum example service, on a server of its own and a loopback
//! port, driven over real HTTP: the migration run twice, the login's two
//! limits in attempt mode (401, then 429 with `Retry-After`, a success
//! given back, no `RateLimit` fields), the API's quota in hit mode with its
//! `RateLimit-Policy` and `RateLimit` fields, `/metrics`, and, once the
//! database is stopped, each route's chosen policy: 503 on the login, 200
//! on the API with the unreachable call counted.
//!
//! Its own test binary: the example installs the global Prometheus recorder,
//! which a process has one of, and the test reads exact counts from it.

#[path = "../examples/axum_sqlx.rs"]
#[allow(dead_code, reason = "the example's main is not used here")]
mod axum_sqlx;
mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use platformkit_limit::{Key, Limit, Limiter, Postgres};
use platformkit_limit_testdb::{Options, Server};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::task::block_in_place;

use crate::axum_sqlx::Limits;
use crate::common::http::{Answer, send};

const WRONG: &str = "password=guess";
const RIGHT: &str = "password=correct+horse+battery+staple";

/// The count of `key` under `limit`, read by a limiter of the test's own
/// over the same pool: the count is the row, not the service's memory.
async fn count(pool: &PgPool, limit: &Limit, key: &Key) -> u64 {
    let reader = Limiter::new(Postgres::new(pool.clone()));
    let verdict = reader.check(limit, key).await.expect("a check");
    verdict.count().expect("the store answered")
}

/// `t` of a `RateLimit` field for `"api"` with `r` left: the seconds until
/// the window ends.
fn reset_in(answer: &Answer, left: u64) -> u64 {
    let field = answer.header("ratelimit").expect("a RateLimit field");
    let t = field
        .strip_prefix(&format!(r#""api";r={left};t="#))
        .unwrap_or_else(|| panic!("RateLimit {field:?}, expected r={left}"));
    t.parse().expect("whole seconds")
}

fn assert_no_ratelimit_fields(answer: &Answer, what: &str) {
    assert_eq!(answer.header("ratelimit"), None, "{what}");
    assert_eq!(answer.header("ratelimit-policy"), None, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlx_service_limits_logins_and_the_api_over_http_then_keeps_its_policies() {
    // A server of its own: the test stops it.
    let server = block_in_place(|| Server::start(Options::default()));
    let db = server.empty_database().await;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&db.url())
        .await
        .expect("a pool");
    axum_sqlx::migrate(&pool).await.expect("the migration");
    axum_sqlx::migrate(&pool)
        .await
        .expect("the migration again, as at every start-up");
    let app = axum_sqlx::router(pool.clone(), axum_sqlx::install_metrics()).expect("the limits");
    let address = crate::common::http::serve(app, true).await;
    let limits = Limits::new().expect("the limits");
    let alice = Key::email("alice@example.com");

    // Windows open on the minute (the login's every 15 minutes): start with
    // at least 10 seconds of this one left (the test takes about 3), so that
    // no count below is cut by a new window.
    let into_minute = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        % 60;
    if into_minute > 50 {
        tokio::time::sleep(Duration::from_secs(61 - into_minute)).await;
    }

    // The login: 3 wrong passwords per account. The account is the header,
    // in any case.
    let as_alice = [("x-account", "Alice@Example.com")];
    for attempt in 1..=2 {
        let answer = send(address, "POST", "/login", &as_alice, WRONG).await;
        assert_eq!(answer.status, 401, "attempt {attempt}: {}", answer.body);
        assert_eq!(answer.retry_after(), None);
        assert_no_ratelimit_fields(&answer, "a per-account limit is never advertised");
    }
    assert_eq!(count(&pool, &limits.login_account, &alice).await, 2);
    // A success: reserved, then given back.
    let welcome = send(address, "POST", "/login", &as_alice, RIGHT).await;
    assert_eq!(welcome.status, 200, "{}", welcome.body);
    assert_eq!(
        count(&pool, &limits.login_account, &alice).await,
        2,
        "the success took its attempt back"
    );
    let third = send(address, "POST", "/login", &as_alice, WRONG).await;
    assert_eq!(third.status, 401);
    assert_eq!(count(&pool, &limits.login_account, &alice).await, 3);
    // Refused now, even with the right password.
    let refused = send(address, "POST", "/login", &as_alice, RIGHT).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let wait = refused.retry_after().expect("a Retry-After field");
    assert!((1..=15 * 60).contains(&wait), "Retry-After {wait}");
    assert_no_ratelimit_fields(&refused, "a refused login");
    // Another account is not affected; the address limit (50) is far off.
    let bob = [("x-account", "bob@example.com")];
    assert_eq!(
        send(address, "POST", "/login", &bob, WRONG).await.status,
        401
    );
    // No account named: the per-account rule is required, so the layer
    // answers 400 before the handler, and nothing is counted.
    let anonymous = send(address, "POST", "/login", &[], WRONG).await;
    assert_eq!(anonymous.status, 400, "{}", anonymous.body);
    assert!(
        anonymous.body.starts_with("bad request:"),
        "the layer's answer"
    );

    // The API: 5 a minute per key, every request counted, advertised.
    let as_demo = [("x-api-key", "demo")];
    for left in (0..5).rev() {
        let answer = send(address, "GET", "/api/items", &as_demo, "").await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.body, "[]\n");
        assert_eq!(answer.header("ratelimit-policy"), Some(r#""api";q=5;w=60"#));
        let t = reset_in(&answer, left);
        assert!((1..=60).contains(&t), "t={t}");
        assert_eq!(answer.retry_after(), None);
    }
    let over = send(address, "GET", "/api/items", &as_demo, "").await;
    assert_eq!(over.status, 429, "{}", over.body);
    assert_eq!(over.header("ratelimit-policy"), Some(r#""api";q=5;w=60"#));
    let t = reset_in(&over, 0);
    let wait = over.retry_after().expect("a Retry-After field");
    assert!((1..=60).contains(&wait), "Retry-After {wait}");
    assert_eq!(wait, t, "Retry-After is when the window resets");
    // Another key has a quota of its own.
    let other = send(address, "GET", "/api/items", &[("x-api-key", "other")], "").await;
    assert_eq!(other.status, 200);
    reset_in(&other, 4);

    let exposition = send(address, "GET", "/metrics", &[], "").await;
    assert_eq!(exposition.status, 200);
    for line in [
        // Alice's four attempts and bob's one, in one statement with the
        // address; the success given back; the refusal.
        r#"platformkit_limit_calls_total{limit="login-account",operation="reserve",outcome="allowed",source="store"} 5"#,
        r#"platformkit_limit_calls_total{limit="login-account",operation="take_back",outcome="cleared",source="store"} 1"#,
        r#"platformkit_limit_calls_total{limit="login-account",operation="reserve",outcome="refused",source="store"} 1"#,
        r#"platformkit_limit_calls_total{limit="api",operation="hit",outcome="allowed",source="store"} 6"#,
        r#"platformkit_limit_calls_total{limit="api",operation="hit",outcome="refused",source="store"} 1"#,
    ] {
        assert!(
            exposition.body.contains(line),
            "missing {line} in\n{}",
            exposition.body
        );
    }
    assert!(!exposition.body.contains("alice"), "no key in the metrics");
    // The example's recorder gives the call duration buckets: the series
    // the dashboard's percentile panels query (a summary has none).
    assert!(
        exposition
            .body
            .contains("platformkit_limit_call_duration_seconds_bucket{"),
        "no duration buckets in\n{}",
        exposition.body
    );

    // The database stops. The login's limits refuse: 503. The API's allows,
    // and says so in the metrics.
    block_in_place(|| server.pg_ctl(&["stop", "-m", "immediate"]));
    let down = send(address, "POST", "/login", &as_alice, RIGHT).await;
    assert_eq!(down.status, 503, "{}", down.body);
    assert_no_ratelimit_fields(&down, "a login with the database down");
    let allowed = send(address, "GET", "/api/items", &[("x-api-key", "third")], "").await;
    assert_eq!(allowed.status, 200, "{}", allowed.body);
    let exposition = send(address, "GET", "/metrics", &[], "").await;
    for line in [
        r#"platformkit_limit_calls_total{limit="login-account",operation="reserve",outcome="unreachable",source="store"} 1"#,
        r#"platformkit_limit_calls_total{limit="api",operation="hit",outcome="unreachable",source="store"} 1"#,
    ] {
        assert!(
            exposition.body.contains(line),
            "missing {line} in\n{}",
            exposition.body
        );
    }
}
