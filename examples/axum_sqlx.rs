//! What most services run: axum over the service's own sqlx `PgPool`, the
//! limiter as a tower layer in front of two routes, its schema applied as a
//! migration at start-up, and Prometheus metrics.
//!
//! ```text
//! cargo run --example axum_sqlx --features sqlx   # on 127.0.0.1:3000
//! curl -si -H 'x-account: alice@example.com' -d 'password=guess' localhost:3000/login
//! curl -si -H 'x-api-key: demo' localhost:3000/api/items
//! curl -s localhost:3000/metrics
//! ```
//!
//! - `POST /login` (header `x-account`, form field `password`): attempt
//!   mode, per account and per client address in one statement; a login
//!   without `x-account` is answered 400 by the layer (`require`), never
//!   tried unlimited. A success
//!   takes the attempt back, so only failures count. Both limits refuse
//!   when the database cannot be reached: the route answers 503 rather than
//!   let password guesses through unlimited. No `RateLimit` fields: on a
//!   login they would tell an attacker how many guesses are left.
//! - `GET /api/items` (header `x-api-key`): hit mode, every request counts,
//!   with the `RateLimit-Policy` and `RateLimit` fields. When the database
//!   cannot be reached it allows (the default) and the metrics count
//!   `outcome="unreachable"`.
//! - `GET /metrics`: the Prometheus exposition.
//!
//! A refusal answers 429 with `Retry-After`.
//!
//! **Why the account is a header.** The layer reads the request head only,
//! never the body, so the per-account key cannot be the form's email field.
//! The client names the account in `x-account`, and the handler signs in
//! the account read by the same function the layer's key uses: the account
//! counted is the account tried. Were the handler to take the account from
//! the body, a client could send a fresh `x-account` with every guess at
//! the body's account. Not the path (`/accounts/{account}/login`): axum
//! decodes percent-escapes in a path parameter, a key function over the raw
//! path would have to decode exactly as axum does, or `alice%40example.com`
//! would be a second counter for alice. (A form login can keep the account
//! in the body and reserve per account in the handler with
//! `Limiter::reserve`: `examples/axum_form_login.rs`.)
//!
//! `main` starts a throwaway PostgreSQL (or uses `DATABASE_URL`, a superuser
//! URL) and gives the service an empty database; the service applies
//! `SCHEMA` and the grants itself, as a migration, over its own pool.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Form;
use axum::http::{HeaderMap, StatusCode, header, request, response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use platformkit_limit::{
    Key, Limit, Limiter, Postgres, PurgeTask, SCHEMA, WhenUnreachable, grants,
};
use platformkit_limit_tower::LimitLayer;
use serde::Deserialize;
use sqlx::PgPool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The migration: the limiter's schema, then the grants for the role the
/// service connects as. Both are safe to run at every start-up. `raw_sql`
/// sends the script as one simple query, which runs every statement in it
/// (the schema's `DO` blocks and dollar quotes included). A service whose
/// migrations run as another role grants to the service's role instead.
pub async fn migrate(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::raw_sql(SCHEMA).execute(pool).await?;
    let role: String = sqlx::query_scalar("SELECT current_user")
        .fetch_one(pool)
        .await?;
    let grants = grants(&role).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    sqlx::raw_sql(&grants).execute(pool).await?;
    Ok(())
}

/// The limits, made once.
pub struct Limits {
    /// Wrong passwords per account.
    pub login_account: Limit,
    /// Wrong passwords per client address, over every account.
    pub login_address: Limit,
    /// Requests per API key.
    pub api: Limit,
}

impl Limits {
    pub fn new() -> Result<Self, platformkit_limit::Error> {
        let login = Duration::from_secs(15 * 60);
        Ok(Limits {
            login_account: Limit::builder("login-account", 3, login)
                .when_unreachable(WhenUnreachable::Refuse)
                .build()?,
            login_address: Limit::builder("login-address", 50, login)
                .when_unreachable(WhenUnreachable::Refuse)
                .build()?,
            api: Limit::new("api", 5, Duration::from_secs(60))?,
        })
    }
}

/// The account a login names: the `x-account` header. The layer's key and
/// the handler both read it here.
pub fn account(headers: &HeaderMap) -> Option<&str> {
    let account = headers.get("x-account")?.to_str().ok()?.trim();
    (!account.is_empty()).then_some(account)
}

/// The API key of a request to the API.
fn api_key(head: &request::Parts) -> Option<Key> {
    Some(Key::opaque(head.headers.get("x-api-key")?.to_str().ok()?))
}

/// The service's routes, with one limiter over the service's own pool in
/// front of them; serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()` for the
/// per-address limit.
pub fn router(pool: PgPool, metrics: PrometheusHandle) -> Result<Router, platformkit_limit::Error> {
    let limiter = Arc::new(Limiter::new(Postgres::new(pool)));
    let limits = Limits::new()?;
    let per_account = |head: &request::Parts| account(&head.headers).map(Key::email);
    let login_limits =
        LimitLayer::attempt(limiter.clone(), |r: &response::Parts| r.status.is_success())
            .require(&limits.login_account, per_account)
            .limit_per_client_ip(&limits.login_address);
    let api_limits = LimitLayer::hit(limiter)
        .limit(&limits.api, api_key)
        .advertise(&limits.api);
    Ok(Router::new()
        .route("/login", post(login).layer(login_limits))
        .route("/api/items", get(items).layer(api_limits))
        .route(
            "/metrics",
            get(move || async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    metrics.render(),
                )
            }),
        ))
}

/// A Prometheus recorder, with buckets for the call duration so that
/// dashboards can plot percentiles. A binary installs it; the library
/// never does.
pub fn install_metrics() -> PrometheusHandle {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(platformkit_limit::metric::CALL_DURATION_SECONDS.to_owned()),
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ],
        )
        .expect("valid buckets")
        .install_recorder()
        .expect("no other recorder is installed")
}

#[derive(Deserialize)]
struct LoginForm {
    password: String,
}

/// The login: the limits were decided before it runs, and the layer
/// answered 400 to a request without an account.
async fn login(headers: HeaderMap, Form(form): Form<LoginForm>) -> (StatusCode, &'static str) {
    let Some(account) = account(&headers) else {
        return (StatusCode::BAD_REQUEST, "name the account in x-account\n");
    };
    // Stands in for the service's own check (a hash in its accounts table,
    // argon2id), on the same pool.
    if account.eq_ignore_ascii_case("alice@example.com")
        && form.password == "correct horse battery staple"
    {
        (StatusCode::OK, "welcome\n")
    } else {
        (StatusCode::UNAUTHORIZED, "wrong account or password\n")
    }
}

async fn items() -> ([(header::HeaderName, &'static str); 1], &'static str) {
    ([(header::CONTENT_TYPE, "application/json")], "[]\n")
}

#[allow(
    dead_code,
    reason = "the integration test includes this file without its main"
)]
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let metrics = install_metrics();
    println!("starting a throwaway PostgreSQL (or using DATABASE_URL) ...");
    let server = tokio::task::spawn_blocking(platformkit_limit_testdb::Server::shared).await?;
    let db = server.empty_database().await;

    // The service's own pool; the limiter borrows from it.
    let pool = PgPool::connect(&db.url()).await?;
    migrate(&pool).await?;
    let _purge = PurgeTask::hourly(pool.clone());
    let app = router(pool, metrics)?;

    let address = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
