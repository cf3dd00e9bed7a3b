//! The tower layer in front of an axum router, driven with `oneshot`: both
//! modes, several limits, exemptions, the client address, the replaceable
//! answer, costs and tiers from the request, 429/503/413/500 and the
//! header fields; over `Memory` on a pinned clock, and over real
//! PostgreSQL.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use crate::common;
use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{ConnectInfo, Extension};
use axum::http::{HeaderMap, Request, Response, StatusCode, header, request, response};
use axum::routing::{get, post};
use common::http;
use common::verdicts::counts_of;
use platformkit_limit::{
    Key, Limit, LimitConn, Limiter, ManualClock, Memory, Postgres, SCHEMA, Store, Verdicts,
    WhenUnreachable,
};
use platformkit_limit_testdb::Server;
use platformkit_limit_tower::{ClientIp, LimitLayer, Rejection};
use tower::ServiceExt as _;

/// The start of a window of a minute, of 15 minutes and of an hour.
const WINDOW_START: u64 = 1_800_000_000;

/// A clock 20.5 seconds into a window, so a minute's window reopens in
/// 39.5 seconds: `Retry-After: 40`, `t=40`.
fn clock() -> ManualClock {
    ManualClock::new(UNIX_EPOCH + Duration::from_millis(WINDOW_START * 1_000 + 20_500))
}

fn memory(clock: &ManualClock) -> Arc<Limiter<Memory>> {
    Arc::new(Limiter::new(Memory::new().with_clock(clock.clone())))
}

fn limit(name: &str, max: u32, window_secs: u64) -> Limit {
    Limit::new(name, max, Duration::from_secs(window_secs)).expect("a limit")
}

/// The tenant the `x-tenant` header names; no header, no key.
fn tenant(head: &request::Parts) -> Option<Key> {
    let tenant = head.headers.get("x-tenant")?.to_str().ok()?;
    Some(Key::opaque(tenant))
}

/// The account the `x-account` header names.
fn account(head: &request::Parts) -> Option<Key> {
    let account = head.headers.get("x-account")?.to_str().ok()?;
    Some(Key::email(account))
}

fn address(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 0, 2, last))
}

fn is_success(response: &response::Parts) -> bool {
    response.status.is_success()
}

/// The verdicts the layer put in the request, as `name=remaining` pairs.
async fn echo(verdicts: Option<Extension<Verdicts>>) -> String {
    let Some(Extension(verdicts)) = verdicts else {
        return "none".to_owned();
    };
    verdicts
        .iter()
        .map(|v| {
            let left = v.remaining().map_or("-".to_owned(), |n| n.to_string());
            format!("{}={left}", v.limit())
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A login: the password `right` succeeds, anything else is a 401.
async fn login(password: String) -> StatusCode {
    if password == "right" {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

/// A router whose one route counts how often it ran.
fn counted_route<S: Store + Send + Sync + 'static>(
    layer: LimitLayer<S>,
) -> (Router, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = runs.clone();
    let router = Router::new()
        .route(
            "/",
            post(move |password: String| {
                seen.fetch_add(1, Ordering::SeqCst);
                login(password)
            }),
        )
        .layer(layer);
    (router, runs)
}

fn ask() -> request::Builder {
    Request::post("/")
}

async fn send(app: &Router, request: request::Builder, body: &'static str) -> Response<Body> {
    let request = request.body(Body::from(body)).expect("a request");
    app.clone().oneshot(request).await.expect("infallible")
}

async fn text(response: Response<Body>) -> String {
    let bytes = to_bytes(response.into_body(), 1 << 16)
        .await
        .expect("a body");
    String::from_utf8(bytes.to_vec()).expect("UTF-8")
}

fn field<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.to_str().expect("ASCII"))
}

/// Alice, from address 7, logs in rightly three times (each success taken
/// back under both limits), wrongly twice (counted under both), then rightly
/// again: refused before the service, and counted. Returns the refusal.
async fn login_until_refused<S: Store>(
    app: &Router,
    request: impl Fn() -> request::Builder,
    limiter: &Limiter<S>,
    per_address: &Limit,
    per_account: &Limit,
) -> Response<Body> {
    let (address_key, account_key) = (Key::ip(address(7)), Key::email("alice@example.com"));
    let pairs = [(per_address, &address_key), (per_account, &account_key)];
    for _ in 0..3 {
        assert_eq!(send(app, request(), "right").await.status(), StatusCode::OK);
    }
    assert_eq!(
        counts_of(limiter, &pairs).await,
        [Some(0), Some(0)],
        "successes taken back"
    );
    for _ in 0..2 {
        let wrong = send(app, request(), "wrong").await;
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(counts_of(limiter, &pairs).await, [Some(2), Some(2)]);
    let refused = send(app, request(), "right").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(counts_of(limiter, &pairs).await, [Some(3), Some(3)]);
    refused
}

#[tokio::test]
async fn hit_mode_counts_every_request_and_refuses_with_429_and_retry_after() {
    let clock = clock();
    let limiter = memory(&clock);
    let api = limit("api", 2, 60);
    let (app, runs) = counted_route(LimitLayer::hit(limiter.clone()).limit(&api, tenant));
    let acme = || ask().header("x-tenant", "acme");

    for _ in 0..2 {
        let response = send(&app, acme(), "right").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(field(response.headers(), "retry-after"), None);
    }
    let refused = send(&app, acme(), "right").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(refused.headers(), "retry-after"), Some("40"));
    assert_eq!(
        field(refused.headers(), "content-type"),
        Some("text/plain; charset=utf-8")
    );
    // Not advertised: no RateLimit fields.
    assert_eq!(field(refused.headers(), "ratelimit"), None);
    assert_eq!(field(refused.headers(), "ratelimit-policy"), None);
    assert_eq!(text(refused).await, "too many requests\n");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the service never ran");

    // Every ask counted, the refused one too; another tenant is apart.
    let count = limiter.check(&api, &Key::opaque("acme")).await.expect("ok");
    assert_eq!(count.count(), Some(3));
    let other = send(&app, ask().header("x-tenant", "globex"), "right").await;
    assert_eq!(other.status(), StatusCode::OK);

    // The next window lets the tenant through again.
    clock.advance(Duration::from_secs(40));
    assert_eq!(send(&app, acme(), "right").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn attempt_mode_counts_only_failures_and_refuses_before_the_service() {
    let clock = clock();
    let limiter = memory(&clock);
    let per_address = limit("login-address", 3, 900);
    let (app, runs) = counted_route(
        LimitLayer::attempt(limiter.clone(), is_success).limit_per_client_ip(&per_address),
    );
    let from = || ask().extension(ClientIp(address(7)));
    let key = Key::ip(address(7));

    // Successes are reserved, then taken back: never a count.
    for _ in 0..5 {
        assert_eq!(send(&app, from(), "right").await.status(), StatusCode::OK);
    }
    let after_successes = limiter.check(&per_address, &key).await.expect("ok");
    assert_eq!(after_successes.count(), Some(0));

    // Failures stay counted.
    for _ in 0..3 {
        let wrong = send(&app, from(), "wrong").await;
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 8);
    // Then even the right password is refused, before the service runs.
    let refused = send(&app, from(), "right").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // 15-minute windows: 900 - 20.5 = 879.5 seconds left.
    assert_eq!(field(refused.headers(), "retry-after"), Some("880"));
    assert_eq!(runs.load(Ordering::SeqCst), 8, "the service never ran");
    // Another address is apart.
    let elsewhere = send(&app, ask().extension(ClientIp(address(8))), "right").await;
    assert_eq!(elsewhere.status(), StatusCode::OK);
}

#[tokio::test]
async fn several_limits_are_decided_together_and_the_verdicts_reach_the_handler() {
    let clock = clock();
    let limiter = memory(&clock);
    let per_address = limit("api-address", 5, 60);
    let per_tenant = limit("api-tenant", 2, 60);
    let layer = LimitLayer::hit(limiter.clone())
        .limit_per_client_ip(&per_address)
        .limit(&per_tenant, tenant);
    let app = Router::new().route("/", post(echo)).layer(layer);
    let request = || {
        ask()
            .extension(ClientIp(address(7)))
            .header("x-tenant", "acme")
    };

    let first = send(&app, request(), "").await;
    assert_eq!(text(first).await, "api-address=4,api-tenant=1");
    let second = send(&app, request(), "").await;
    assert_eq!(text(second).await, "api-address=3,api-tenant=0");
    let refused = send(&app, request(), "").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(refused.headers(), "retry-after"), Some("40"));

    // Counted under both, in one call: the refused ask too.
    let (address_key, tenant_key) = (Key::ip(address(7)), Key::opaque("acme"));
    let counts = limiter
        .check_all(&[(&per_address, &address_key), (&per_tenant, &tenant_key)])
        .await
        .expect("ok");
    assert_eq!(
        counts.iter().map(|v| v.count()).collect::<Vec<_>>(),
        [Some(3), Some(3)]
    );
}

#[tokio::test]
async fn attempt_mode_over_several_limits_takes_a_success_back_under_each() {
    let clock = clock();
    let limiter = memory(&clock);
    let per_address = limit("login-address", 10, 900);
    let per_account = limit("login-account", 2, 900);
    let layer = LimitLayer::attempt(limiter.clone(), is_success)
        .limit_per_client_ip(&per_address)
        .limit(&per_account, account);
    let (app, _) = counted_route(layer);
    let request = || {
        ask()
            .extension(ClientIp(address(7)))
            .header("x-account", "alice@example.com")
    };
    login_until_refused(&app, request, &limiter, &per_address, &per_account).await;
}

#[tokio::test]
async fn a_key_function_that_returns_none_exempts_the_request() {
    let clock = clock();
    let limiter = memory(&clock);
    let per_tenant = limit("api-tenant", 1, 60);
    let per_account = limit("api-account", 1, 60);
    let layer = LimitLayer::hit(limiter.clone())
        .limit(&per_tenant, tenant)
        .limit(&per_account, account);
    let app = Router::new().route("/", post(echo)).layer(layer);

    // No rule gives a key: no call, no verdicts, never limited.
    for _ in 0..5 {
        let response = send(&app, ask(), "").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(text(response).await, "none");
    }
    // One rule gives a key: only its limit decides.
    let tenant_only = || ask().header("x-tenant", "acme");
    let first = send(&app, tenant_only(), "").await;
    assert_eq!(text(first).await, "api-tenant=0");
    let second = send(&app, tenant_only(), "").await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let untouched = limiter
        .check(&per_account, &Key::email("alice@example.com"))
        .await
        .expect("ok");
    assert_eq!(untouched.count(), Some(0));
}

#[tokio::test]
async fn the_answer_to_a_refusal_is_replaceable_and_keeps_retry_after_and_the_fields() {
    let clock = clock();
    let limiter = memory(&clock);
    let api = limit("api", 1, 60);
    let layer = LimitLayer::hit(limiter)
        .limit(&api, tenant)
        .advertise(&api)
        .on_rejection(|rejection: Rejection| {
            let Rejection::Refused(verdicts) = &rejection else {
                panic!("a refusal by count");
            };
            let limit = verdicts.refused_by().map(|v| v.limit()).unwrap_or_default();
            Response::builder()
                .status(rejection.status())
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(format!(
                    r#"{{"type":"quota-exceeded","limit":"{limit}"}}"#
                )))
                .expect("a response")
        });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let acme = || Request::get("/").header("x-tenant", "acme");

    assert_eq!(send(&app, acme(), "").await.status(), StatusCode::OK);
    let refused = send(&app, acme(), "").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        field(refused.headers(), "content-type"),
        Some("application/json")
    );
    // Added by the layer, since the handler's response lacks them.
    assert_eq!(field(refused.headers(), "retry-after"), Some("40"));
    assert_eq!(
        field(refused.headers(), "ratelimit"),
        Some(r#""api";r=0;t=40"#)
    );
    assert_eq!(
        text(refused).await,
        r#"{"type":"quota-exceeded","limit":"api"}"#
    );
}

#[tokio::test]
async fn a_retry_after_the_handler_sets_is_kept() {
    let limiter = memory(&clock());
    let api = limit("api", 1, 60);
    let layer =
        LimitLayer::hit(limiter)
            .limit(&api, tenant)
            .on_rejection(|rejection: Rejection| {
                Response::builder()
                    .status(rejection.status())
                    .header(header::RETRY_AFTER, "3600")
                    .body(Body::empty())
                    .expect("a response")
            });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let acme = || Request::get("/").header("x-tenant", "acme");
    send(&app, acme(), "").await;
    let refused = send(&app, acme(), "").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(refused.headers(), "retry-after"), Some("3600"));
}

#[tokio::test]
async fn advertised_limits_send_the_ratelimit_fields_and_others_never() {
    let clock = clock();
    let limiter = memory(&clock);
    let api = limit("api", 10, 60);
    let per_account = limit("api-account", 3, 3600);
    let layer = LimitLayer::hit(limiter)
        .limit(&api, tenant)
        .limit(&per_account, account)
        .advertise(&api);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let request = || {
        Request::get("/")
            .header("x-tenant", "acme")
            .header("x-account", "alice@example.com")
    };

    let allowed = send(&app, request(), "").await;
    assert_eq!(allowed.status(), StatusCode::OK);
    assert_eq!(
        field(allowed.headers(), "ratelimit-policy"),
        Some(r#""api";q=10;w=60"#)
    );
    assert_eq!(
        field(allowed.headers(), "ratelimit"),
        Some(r#""api";r=9;t=40"#)
    );
    for _ in 0..2 {
        send(&app, request(), "").await;
    }
    // Refused by the per-account limit, which is never advertised: the
    // fields still say only what the API quota has left.
    let refused = send(&app, request(), "").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // The hour's window reopens in 3600 - 20.5 seconds.
    assert_eq!(field(refused.headers(), "retry-after"), Some("3580"));
    assert_eq!(
        field(refused.headers(), "ratelimit-policy"),
        Some(r#""api";q=10;w=60"#)
    );
    assert_eq!(
        field(refused.headers(), "ratelimit"),
        Some(r#""api";r=6;t=40"#)
    );
    for (name, value) in refused.headers() {
        let value = value.to_str().expect("ASCII");
        assert!(
            !value.contains("alice") && !value.contains("acme"),
            "{name}: {value} carries a key"
        );
    }
}

#[tokio::test]
async fn the_client_address_comes_from_connect_info_or_client_ip_never_a_header() {
    let clock = clock();
    let limiter = memory(&clock);
    let per_address = limit("api-address", 1, 60);
    let layer = LimitLayer::hit(limiter.clone()).limit_per_client_ip(&per_address);
    let app = Router::new().route("/", post(echo)).layer(layer);
    let peer = |last: u8| ConnectInfo(SocketAddr::new(address(last), 50_000));

    let first = send(&app, ask().extension(peer(7)), "").await;
    assert_eq!(first.status(), StatusCode::OK);
    // A forged X-Forwarded-For changes nothing: the socket's address counts.
    let forged = ask()
        .extension(peer(7))
        .header("x-forwarded-for", "203.0.113.9");
    assert_eq!(
        send(&app, forged, "").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another peer is apart.
    assert_eq!(
        send(&app, ask().extension(peer(8)), "").await.status(),
        StatusCode::OK
    );
    // A ClientIp set before the layer (by a proxy-aware middleware) wins
    // over the socket's address, which is then the proxy's.
    let behind_proxy = ask().extension(peer(8)).extension(ClientIp(address(9)));
    assert_eq!(send(&app, behind_proxy, "").await.status(), StatusCode::OK);
    let counted = limiter
        .check(&per_address, &Key::ip(address(9)))
        .await
        .expect("ok");
    assert_eq!(counted.count(), Some(1));
}

/// What the answer to a request without a client address must say: how to
/// hand the layer the address.
fn says_how_to_hand_over_the_address(body: &str) {
    assert!(body.starts_with("internal server error: "), "{body}");
    assert!(
        body.contains("into_make_service_with_connect_info::<SocketAddr>()")
            && body.contains("ClientIp")
            && body.contains("trusted proxy"),
        "{body}"
    );
}

#[tokio::test]
async fn a_request_without_a_client_address_is_answered_500_not_let_through() {
    let limiter = memory(&clock());
    let per_address = limit("api-address", 100, 60);
    let (app, runs) = counted_route(LimitLayer::hit(limiter).limit_per_client_ip(&per_address));
    let response = send(&app, ask(), "right").await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    says_how_to_hand_over_the_address(&text(response).await);
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // The answer is replaceable, and names the rule's limit.
    let layer = LimitLayer::hit(memory(&clock()))
        .limit_per_client_ip(&per_address)
        .on_rejection(|rejection: Rejection| {
            let Rejection::NoClientAddress { limit } = &rejection else {
                panic!("no client address, not {rejection:?}");
            };
            let mut answer = Response::new(Body::from(format!("no address for {limit}")));
            *answer.status_mut() = rejection.status();
            answer
        });
    let app = Router::new().route("/", post(echo)).layer(layer);
    let replaced = send(&app, ask(), "").await;
    assert_eq!(replaced.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(text(replaced).await, "no address for api-address");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_service_served_without_connect_info_answers_500_saying_how_to_fix_it() {
    let db = Server::shared().database(SCHEMA).await;
    let limiter = Arc::new(Limiter::new(Postgres::new(db.config())));
    let per_address = limit("login-address", 3, 900);
    let (app, runs) = counted_route(
        LimitLayer::attempt(limiter.clone(), is_success).limit_per_client_ip(&per_address),
    );

    // Served as `axum::serve(listener, app)`: no address, from the first
    // request on, and never let through.
    let forgot = http::serve(app.clone(), false).await;
    for _ in 0..2 {
        let answer = http::send(forgot, "POST", "/", &[], "password=wrong").await;
        assert_eq!(answer.status, 500, "{}", answer.body);
        says_how_to_hand_over_the_address(&answer.body);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the service never ran");

    // Served as the message says: limited per address, in the database.
    let fixed = http::serve(app, true).await;
    let answer = http::send(fixed, "POST", "/", &[], "password=wrong").await;
    assert_eq!(answer.status, 401, "{}", answer.body);
    let loopback = Key::ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let counted = limiter.check(&per_address, &loopback).await.expect("ok");
    assert_eq!(counted.count(), Some(1));
}

#[tokio::test]
async fn a_required_key_that_is_missing_is_answered_400_and_the_answer_is_replaceable() {
    let clock = clock();
    let limiter = memory(&clock);
    let per_account = limit("login-account", 2, 900);
    let (app, runs) = counted_route(
        LimitLayer::attempt(limiter.clone(), is_success).require(&per_account, account),
    );
    let missing = send(&app, ask(), "wrong").await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        text(missing).await,
        "bad request: the request lacks the key a rate limit counts it by\n"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let layer = LimitLayer::hit(limiter)
        .limit(&limit("api", 100, 60), tenant)
        .require(&per_account, account)
        .on_rejection(|rejection: Rejection| {
            let Rejection::MissingKey { limit } = &rejection else {
                panic!("a missing key, not {rejection:?}");
            };
            let mut answer = Response::new(Body::from(format!("name the account ({limit})")));
            *answer.status_mut() = rejection.status();
            answer
        });
    let app = Router::new().route("/", post(echo)).layer(layer);
    // The other rule's key is there; the required one is not.
    let replaced = send(&app, ask().header("x-tenant", "acme"), "").await;
    assert_eq!(replaced.status(), StatusCode::BAD_REQUEST);
    assert_eq!(text(replaced).await, "name the account (login-account)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_login_without_its_required_account_is_400_never_an_unlimited_attempt() {
    let db = Server::shared().database(SCHEMA).await;
    let limiter = Arc::new(Limiter::new(Postgres::new(db.config())));
    let per_account = limit("login", 5, 900);
    let (app, runs) = counted_route(
        LimitLayer::attempt(limiter.clone(), is_success).require(&per_account, account),
    );
    let service = http::serve(app, true).await;

    // The newcomer's eight logins without `x-account`: each a 400 before
    // the service, never a password tried unlimited.
    for attempt in 1..=8 {
        let answer = http::send(service, "POST", "/", &[], "wrong").await;
        assert_eq!(answer.status, 400, "attempt {attempt}: {}", answer.body);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the service never ran");

    // With the account: five wrong passwords, then refused.
    let alice = [("x-account", "alice@example.com")];
    for attempt in 1..=5 {
        let answer = http::send(service, "POST", "/", &alice, "wrong").await;
        assert_eq!(answer.status, 401, "attempt {attempt}: {}", answer.body);
    }
    let refused = http::send(service, "POST", "/", &alice, "right").await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert!(refused.retry_after().is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    let counted = limiter
        .check(&per_account, &Key::email("alice@example.com"))
        .await
        .expect("ok");
    assert_eq!(counted.count(), Some(6));
}

#[tokio::test]
async fn layers_stack_and_the_handler_sees_each_verdict() {
    let clock = clock();
    let limiter = memory(&clock);
    let api = limit("api", 100, 60);
    let per_address = limit("login-address", 5, 900);
    let app = Router::new()
        .route("/", post(echo))
        .layer(LimitLayer::attempt(limiter.clone(), is_success).limit_per_client_ip(&per_address))
        .layer(LimitLayer::hit(limiter).limit(&api, tenant));
    let request = ask()
        .extension(ClientIp(address(7)))
        .header("x-tenant", "acme");
    let response = send(&app, request, "").await;
    assert_eq!(text(response).await, "api=99,login-address=4");
}

/// A connection source whose database is gone.
struct Down;

impl LimitConn for Down {
    type Conn = Box<tokio_postgres::Client>;
    type Error = std::io::Error;

    async fn conn(&self) -> Result<Self::Conn, Self::Error> {
        // Nothing listens at its address: down, with no probe.
        Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    }
}

#[tokio::test]
async fn an_unreachable_store_answers_503_or_passes_as_each_limit_chooses() {
    let limiter = Arc::new(Limiter::new(Postgres::new(Down)));
    let strict = Limit::builder("strict", 5, Duration::from_secs(60))
        .when_unreachable(WhenUnreachable::Refuse)
        .build()
        .expect("a limit");
    let lenient = limit("lenient", 5, 60);

    let app = Router::new()
        .route("/", post(echo))
        .layer(LimitLayer::hit(limiter.clone()).limit(&strict, tenant));
    let refused = send(&app, ask().header("x-tenant", "acme"), "").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(field(refused.headers(), "retry-after"), None);
    assert_eq!(text(refused).await, "service unavailable\n");

    let app = Router::new().route("/", post(echo)).layer(
        LimitLayer::hit(limiter)
            .limit(&lenient, tenant)
            .advertise(&lenient),
    );
    let allowed = send(&app, ask().header("x-tenant", "acme"), "").await;
    assert_eq!(allowed.status(), StatusCode::OK);
    // Nothing counted, so neither field: a policy sent alone would tell the
    // client that the limit is failing open.
    assert_eq!(field(allowed.headers(), "ratelimit"), None);
    assert_eq!(field(allowed.headers(), "ratelimit-policy"), None);
    assert_eq!(text(allowed).await, "lenient=-");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_postgres_an_attempt_layer_reserves_each_limit_and_takes_successes_back() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = clock();
    let limiter = Arc::new(Limiter::new(
        Postgres::new(db.config()).with_clock(clock.clone()),
    ));
    let per_address = limit("login-address", 10, 900);
    let per_account = limit("login-account", 2, 900);
    let app = Router::new().route("/", post(login)).layer(
        LimitLayer::attempt(limiter.clone(), is_success)
            .limit_per_client_ip(&per_address)
            .limit(&per_account, account),
    );
    let request = || {
        ask()
            .extension(ConnectInfo(SocketAddr::new(address(7), 50_000)))
            .header("x-account", "Alice@Example.com")
    };
    let refused = login_until_refused(&app, request, &limiter, &per_address, &per_account).await;
    assert_eq!(field(refused.headers(), "retry-after"), Some("880"));

    // A hit layer over the same database, two limits in one statement.
    let api = limit("api", 1, 60);
    let app = Router::new().route("/", post(echo)).layer(
        LimitLayer::hit(limiter)
            .limit(&api, tenant)
            .limit_per_client_ip(&per_address)
            .advertise(&api),
    );
    let acme = || {
        ask()
            .extension(ClientIp(address(8)))
            .header("x-tenant", "acme")
    };
    let allowed = send(&app, acme(), "").await;
    assert_eq!(
        field(allowed.headers(), "ratelimit"),
        Some(r#""api";r=0;t=40"#)
    );
    assert_eq!(text(allowed).await, "api=0,login-address=9");
    let refused = send(&app, acme(), "").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(refused.headers(), "retry-after"), Some("40"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_postgres_a_hard_error_is_answered_500_never_a_silent_allow() {
    // No schema: the limiter's procedure does not exist.
    let db = Server::shared().empty_database().await;
    let limiter = Arc::new(Limiter::new(Postgres::new(db.config())));
    let api = limit("api", 100, 60);
    let (app, runs) = counted_route(LimitLayer::hit(limiter).limit(&api, tenant));
    let response = send(&app, ask().header("x-tenant", "acme"), "").await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// What the `x-items` header says a request costs; 1 without it. Not
/// raised to 1: a cost of 0 is the layer's to handle.
fn items(head: &request::Parts) -> u32 {
    head.headers
        .get("x-items")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

#[tokio::test]
async fn a_cost_function_counts_each_request_its_cost_under_every_rule() {
    let clock = clock();
    let limiter = memory(&clock);
    let api = limit("api", 10, 60);
    let per_account = limit("api-account", 20, 3600);
    let layer = LimitLayer::hit(limiter.clone())
        .limit(&api, tenant)
        .limit(&per_account, account)
        .cost(items)
        .advertise(&api);
    let (app, runs) = counted_route(layer);
    let batch = |n: u32| {
        ask()
            .header("x-tenant", "acme")
            .header("x-account", "alice@example.com")
            .header("x-items", n)
    };
    let (acme, alice) = (Key::opaque("acme"), Key::email("alice@example.com"));
    let pairs = [(&api, &acme), (&per_account, &alice)];

    let allowed = send(&app, batch(6), "right").await;
    assert_eq!(allowed.status(), StatusCode::OK);
    assert_eq!(
        field(allowed.headers(), "ratelimit"),
        Some(r#""api";r=4;t=40"#)
    );
    assert_eq!(counts_of(&limiter, &pairs).await, [Some(6), Some(6)]);
    // No header: a cost of 1.
    let one = ask()
        .header("x-tenant", "acme")
        .header("x-account", "alice@example.com");
    assert_eq!(send(&app, one, "right").await.status(), StatusCode::OK);
    assert_eq!(counts_of(&limiter, &pairs).await, [Some(7), Some(7)]);
    // 7 + 4 passes 10: refused with 429, and counted under both.
    let refused = send(&app, batch(4), "right").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(refused.headers(), "retry-after"), Some("40"));
    assert_eq!(counts_of(&limiter, &pairs).await, [Some(11), Some(11)]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_cost_of_zero_passes_uncounted_and_a_cost_above_max_is_413_without_retry_after() {
    let clock = clock();
    let limiter = memory(&clock);
    let api = limit("api", 10, 60);
    let per_account = limit("api-account", 20, 3600);
    let layer = LimitLayer::hit(limiter.clone())
        .limit(&api, tenant)
        .require(&per_account, account)
        .cost(items)
        .advertise(&api);
    let (app, runs) = counted_route(layer);
    let batch = |n: u32| {
        ask()
            .header("x-tenant", "acme")
            .header("x-account", "alice@example.com")
            .header("x-items", n)
    };
    let (acme, alice) = (Key::opaque("acme"), Key::email("alice@example.com"));
    let pairs = [(&api, &acme), (&per_account, &alice)];

    let free = send(&app, batch(0), "right").await;
    assert_eq!(free.status(), StatusCode::OK);
    assert_eq!(field(free.headers(), "ratelimit"), None, "not asked");
    assert_eq!(counts_of(&limiter, &pairs).await, [Some(0), Some(0)]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Free, but the required key still comes first.
    let anonymous = ask().header("x-tenant", "acme").header("x-items", 0);
    let anonymous = send(&app, anonymous, "right").await;
    assert_eq!(anonymous.status(), StatusCode::BAD_REQUEST);

    // 11 is above the API quota's max (not the account's): 413, nothing
    // counted under either, no Retry-After, the service never runs.
    let too_large = send(&app, batch(11), "right").await;
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(field(too_large.headers(), "retry-after"), None);
    assert_eq!(
        text(too_large).await,
        "content too large: the request costs more than a rate limit ever allows\n"
    );
    assert_eq!(counts_of(&limiter, &pairs).await, [Some(0), Some(0)]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The max itself fits.
    assert_eq!(
        send(&app, batch(10), "right").await.status(),
        StatusCode::OK
    );
    assert_eq!(counts_of(&limiter, &pairs).await, [Some(10), Some(10)]);

    // The rejection handler sees which limit, and that waiting won't help.
    let seen = Arc::new(std::sync::Mutex::new(None));
    let saw = seen.clone();
    let layer = LimitLayer::hit(limiter.clone())
        .limit(&api, tenant)
        .cost(items)
        .on_rejection(move |rejection: Rejection| {
            if let Rejection::TooLarge(verdicts) = &rejection {
                let by = verdicts.refused_by().expect("a refusal");
                *saw.lock().unwrap() = Some((by.limit().to_owned(), by.exceeds_max()));
            }
            let mut response = Response::new(Body::empty());
            *response.status_mut() = rejection.status();
            response
        });
    let app = Router::new().route("/", post(login)).layer(layer);
    let answered = send(&app, batch(11), "right").await;
    assert_eq!(answered.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(*seen.lock().unwrap(), Some(("api".to_owned(), true)));
}

#[tokio::test]
async fn attempt_mode_reserves_the_cost_and_a_success_takes_it_all_back() {
    let clock = clock();
    let limiter = memory(&clock);
    let exports = limit("exports", 10, 3600);
    let layer = LimitLayer::attempt(limiter.clone(), is_success)
        .limit(&exports, tenant)
        .cost(items);
    let (app, _) = counted_route(layer);
    let batch = |n: u32| ask().header("x-tenant", "acme").header("x-items", n);
    let acme = Key::opaque("acme");
    let count = || async { limiter.check(&exports, &acme).await.unwrap().count() };

    assert_eq!(send(&app, batch(6), "right").await.status(), StatusCode::OK);
    assert_eq!(
        count().await,
        Some(0),
        "a success takes the whole cost back"
    );
    let failed = send(&app, batch(6), "wrong").await;
    assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(count().await, Some(6), "a failure keeps it");
    let refused = send(&app, batch(6), "right").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let too_large = send(&app, batch(11), "right").await;
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(count().await, Some(12), "the refusal counted, the 413 not");
}

/// What an authentication layer puts in the request: who, and the plan.
#[derive(Clone)]
struct Caller {
    id: &'static str,
    paid: bool,
}

fn caller(head: &request::Parts) -> Option<Key> {
    Some(Key::opaque(head.extensions.get::<Caller>()?.id))
}

/// A hit layer counting each caller under `free`, or `paid` for a caller
/// on the paid plan, advertised; its route answers the verdicts.
fn tiered<S: Store + 'static>(limiter: Arc<Limiter<S>>, free: &Limit, paid: &Limit) -> Router {
    let paid = paid.clone();
    let plan = move |head: &request::Parts| {
        let caller = head.extensions.get::<Caller>()?;
        caller.paid.then(|| paid.clone())
    };
    let layer = LimitLayer::hit(limiter)
        .limit(free, caller)
        .tier(free, plan)
        .advertise(free);
    Router::new().route("/", post(echo)).layer(layer)
}

fn as_caller(paid: bool) -> request::Builder {
    ask().extension(Caller { id: "c-9", paid })
}

#[tokio::test]
async fn a_tier_from_the_request_counts_in_one_row_and_the_fields_show_its_quota() {
    let clock = clock();
    let limiter = memory(&clock);
    let free = limit("api", 2, 60);
    let paid = free.with_max(100).expect("a tier");
    let app = tiered(limiter.clone(), &free, &paid);

    for left in [1, 0] {
        let allowed = send(&app, as_caller(false), "").await;
        assert_eq!(allowed.status(), StatusCode::OK);
        assert_eq!(
            field(allowed.headers(), "ratelimit-policy"),
            Some(r#""api";q=2;w=60"#)
        );
        assert_eq!(text(allowed).await, format!("api={left}"));
    }
    let refused = send(&app, as_caller(false), "").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // Upgraded: the same count (4 with this request), the paid quota.
    let upgraded = send(&app, as_caller(true), "").await;
    assert_eq!(upgraded.status(), StatusCode::OK);
    assert_eq!(
        field(upgraded.headers(), "ratelimit-policy"),
        Some(r#""api";q=100;w=60"#)
    );
    assert_eq!(
        field(upgraded.headers(), "ratelimit"),
        Some(r#""api";r=96;t=40"#)
    );
    assert_eq!(text(upgraded).await, "api=96");
    // Downgraded again: the count is still there.
    let downgraded = send(&app, as_caller(false), "").await;
    assert_eq!(downgraded.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        field(downgraded.headers(), "ratelimit-policy"),
        Some(r#""api";q=2;w=60"#)
    );
    let counted = limiter.check(&paid, &Key::opaque("c-9")).await.unwrap();
    assert_eq!(counted.count(), Some(5), "one row under both tiers");
}

#[tokio::test]
async fn a_tier_that_is_not_the_rules_limit_under_another_max_is_answered_500() {
    let clock = clock();
    let limiter = memory(&clock);
    let free = limit("api", 2, 60);
    for wrong in [
        limit("api-paid", 100, 60),
        limit("api", 100, 3600),
        Limit::builder("api", 100, Duration::from_secs(60))
            .lockout(Duration::from_secs(60))
            .build()
            .unwrap(),
    ] {
        let app = tiered(limiter.clone(), &free, &wrong);
        let answered = send(&app, as_caller(true), "").await;
        assert_eq!(
            answered.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{wrong:?}"
        );
        // The free plan is unaffected.
        let free_plan = send(&app, as_caller(false), "").await;
        assert_eq!(free_plan.status(), StatusCode::OK, "{wrong:?}");
        limiter.reset(&free, &Key::opaque("c-9")).await.unwrap();
    }
    let nothing = limiter.check(&free, &Key::opaque("c-9")).await.unwrap();
    assert_eq!(nothing.count(), Some(0));
}

/// Over PostgreSQL, with the refusal cache: a caller flooded with
/// refusals on the free tier is answered from the cache on the free tier
/// only; upgraded, its next request is asked of the store and allowed,
/// with the paid tier's fields, and the count is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_postgres_a_refusal_cached_on_the_free_tier_never_refuses_the_paid_one() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = clock();
    let limiter = Arc::new(Limiter::new(
        Postgres::new(db.config()).with_clock(clock.clone()),
    ));
    let free = limit("api", 2, 60);
    let paid = free.with_max(100).expect("a tier");
    let app = tiered(limiter.clone(), &free, &paid);

    for _ in 0..2 {
        assert_eq!(
            send(&app, as_caller(false), "").await.status(),
            StatusCode::OK
        );
    }
    // Refused enough times to engage the cache, and once more from it.
    for _ in 0..=Limiter::FLOOD_REFUSALS {
        let refused = send(&app, as_caller(false), "").await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let counted = limiter.check(&free, &Key::opaque("c-9")).await.unwrap();
    assert_eq!(
        counted.count(),
        Some(5),
        "the cached refusal counted nothing"
    );

    let upgraded = send(&app, as_caller(true), "").await;
    assert_eq!(upgraded.status(), StatusCode::OK);
    assert_eq!(
        field(upgraded.headers(), "ratelimit"),
        Some(r#""api";r=94;t=40"#)
    );
    let counted = limiter.check(&paid, &Key::opaque("c-9")).await.unwrap();
    assert_eq!(counted.count(), Some(6), "one count under both tiers");
}

/// A quota layer, all or nothing: a request the per-minute rule refuses
/// spends nothing of the per-day one, a cost is counted under both or
/// neither, and the RateLimit fields show the day's quota untouched.
async fn all_or_nothing_spends_no_quota_on_a_refusal<S: Store + Send + Sync + 'static>(
    limiter: Arc<Limiter<S>>,
    clock: &ManualClock,
) {
    let per_minute = limit("api-minute", 3, 60);
    let per_day = limit("api-day", 10, 86_400);
    let layer = LimitLayer::hit_all_or_nothing(limiter.clone())
        .limit(&per_minute, tenant)
        .limit(&per_day, tenant)
        .cost(items)
        .advertise(&per_day);
    let (app, runs) = counted_route(layer);
    let batch = |n: u32| ask().header("x-tenant", "acme").header("x-items", n);
    let acme = Key::opaque("acme");
    let pairs = [(&per_minute, &acme), (&per_day, &acme)];

    assert_eq!(send(&app, batch(2), "right").await.status(), StatusCode::OK);
    let refused = send(&app, batch(2), "right").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(refused.headers(), "retry-after"), Some("40"));
    assert_eq!(counts_of(&limiter, &pairs).await, [Some(2), Some(2)]);
    let one = send(&app, batch(1), "right").await;
    assert_eq!(one.status(), StatusCode::OK);
    let day = field(one.headers(), "ratelimit").unwrap_or_default();
    assert!(day.starts_with(r#""api-day";r=7;"#), "{day}");
    assert_eq!(counts_of(&limiter, &pairs).await, [Some(3), Some(3)]);
    // The next minute: 3 of the day's 7 left fit, then 5 do not.
    clock.advance(Duration::from_secs(60));
    assert_eq!(send(&app, batch(3), "right").await.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(60));
    let over = send(&app, batch(3), "right").await;
    assert_eq!(over.status(), StatusCode::OK, "6 + 3 fits the day's 10");
    clock.advance(Duration::from_secs(60));
    let day = send(&app, batch(2), "right").await;
    assert_eq!(
        day.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "9 + 2 passes 10"
    );
    assert_eq!(counts_of(&limiter, &pairs).await, [Some(0), Some(9)]);
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn an_all_or_nothing_layer_spends_no_quota_on_a_refusal() {
    let clock = clock();
    all_or_nothing_spends_no_quota_on_a_refusal(memory(&clock), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_postgres_an_all_or_nothing_layer_spends_no_quota_on_a_refusal() {
    let db = Server::shared().database(SCHEMA).await;
    let clock = clock();
    let limiter = Arc::new(Limiter::new(
        Postgres::new(db.config()).with_clock(clock.clone()),
    ));
    all_or_nothing_spends_no_quota_on_a_refusal(limiter, &clock).await;
}

#[tokio::test]
async fn an_all_or_nothing_layer_with_one_pair_twice_is_answered_500_never_let_through() {
    let clock = clock();
    let api = limit("api", 3, 60);
    let layer = LimitLayer::hit_all_or_nothing(memory(&clock))
        .limit(&api, tenant)
        .limit(&api, tenant);
    let (app, runs) = counted_route(layer);
    let twice = send(&app, ask().header("x-tenant", "acme"), "right").await;
    assert_eq!(twice.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Tiers and advertised fields are set on a rule already added: for a limit
/// no rule has, each panics, naming itself and the limit.
#[test]
fn a_tier_or_advertised_fields_for_a_limit_no_rule_has_panic_naming_it() {
    let other = limit("other", 1, 60);
    let panic_of = |set: &dyn Fn(LimitLayer<Memory>) -> LimitLayer<Memory>| {
        let layer = LimitLayer::hit(memory(&clock())).limit(&limit("api", 1, 60), tenant);
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| set(layer)))
            .expect_err("no rule has the limit");
        *panic.downcast::<String>().expect("a formatted message")
    };
    let tier = panic_of(&|layer| layer.tier(&other, |_| None));
    let advertise = panic_of(&|layer| layer.advertise(&other));
    for (method, message) in [("tier", tier), ("advertise", advertise)] {
        assert!(message.starts_with(&format!("{method}: ")), "{message}");
        assert!(message.contains(r#"the limit "other""#), "{message}");
    }
}
