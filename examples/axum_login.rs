//! An axum service with the limiter in front of its password work.
//!
//! ```text
//! cargo run --example axum_login --features deadpool   # on 127.0.0.1:3000
//! curl -si -d 'email=alice@example.com&password=wrong' localhost:3000/login
//! curl -s localhost:3000/metrics
//! ```
//!
//! - `POST /login` (`email`, `password`): `check` before the (simulated)
//!   password work, `failed` after a wrong password, `reset` after a good one;
//! - `POST /password/forgot` (`email`): `hit`, since every ask costs an email;
//! - `POST /password/reset` (`email`, `code`): limits guesses of the emailed
//!   code;
//! - `GET /metrics`: the Prometheus exposition.
//!
//! A refused attempt answers `429 Too Many Requests` with `Retry-After`. An
//! unreachable limiter lets the attempt through (and the metrics say so).
//!
//! It starts a throwaway PostgreSQL (or uses `DATABASE_URL`, a superuser URL)
//! and applies `schema.sql`; a real service runs `SCHEMA` in its migrations.
//! The limiter borrows its connections from the service's own deadpool pool.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use platformkit_limit::{Key, Limit, LimitConn, Limiter, Postgres, Verdict};
use serde::Deserialize;

/// What the routes share.
pub struct App<C> {
    limiter: Limiter<Postgres<C>>,
    login: Limit,
    forgot: Limit,
    reset_code: Limit,
    metrics: PrometheusHandle,
}

impl<C: LimitConn + 'static> App<C> {
    /// The limits of this service, over `conns`.
    pub fn new(conns: C, metrics: PrometheusHandle) -> Result<Self, platformkit_limit::Error> {
        Ok(App {
            limiter: Limiter::new(Postgres::new(conns)),
            login: Limit::new("login", 5, Duration::from_secs(15 * 60))?,
            forgot: Limit::new("password-forgot", 3, Duration::from_secs(60 * 60))?,
            reset_code: Limit::new("password-reset-code", 5, Duration::from_secs(15 * 60))?,
            metrics,
        })
    }
}

/// The router: every route of the service.
pub fn router<C: LimitConn + 'static>(app: Arc<App<C>>) -> Router {
    Router::new()
        .route("/login", post(login::<C>))
        .route("/password/forgot", post(forgot::<C>))
        .route("/password/reset", post(reset::<C>))
        .route("/metrics", get(metrics::<C>))
        .with_state(app)
}

/// A Prometheus recorder with histogram buckets for the call duration, so
/// dashboards can plot percentiles.
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
    email: String,
    password: String,
}

#[derive(Deserialize)]
struct ForgotForm {
    email: String,
}

#[derive(Deserialize)]
struct ResetForm {
    email: String,
    code: String,
}

/// The answer to a refused attempt: 429 with Retry-After in whole seconds.
fn too_many(verdict: &Verdict) -> Response {
    let wait = verdict.retry_after().unwrap_or_default();
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut response = (StatusCode::TOO_MANY_REQUESTS, "too many attempts\n").into_response();
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_str(&secs.to_string()).expect("digits are a valid header"),
    );
    response
}

/// A hard limiter error (a misconfiguration): never a silent allow.
fn broken(error: platformkit_limit::Error) -> Response {
    eprintln!("limiter error: {error}");
    (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response()
}

async fn login<C: LimitConn + 'static>(
    State(app): State<Arc<App<C>>>,
    Form(form): Form<LoginForm>,
) -> Response {
    let account = Key::email(&form.email);
    match app.limiter.check(&app.login, &account).await {
        Ok(verdict) if verdict.is_refused() => return too_many(&verdict),
        Ok(_) => {}
        Err(e) => return broken(e),
    }
    // The password work the limit guards (argon2id in a real service).
    tokio::time::sleep(Duration::from_millis(20)).await;
    if form.password == "correct horse battery staple" {
        if let Err(e) = app.limiter.reset(&app.login, &account).await {
            eprintln!("could not clear the login count: {e}");
        }
        return (StatusCode::OK, "welcome\n").into_response();
    }
    match app.limiter.failed(&app.login, &account).await {
        Ok(verdict) if verdict.is_refused() => too_many(&verdict),
        Ok(_) => (StatusCode::UNAUTHORIZED, "wrong email or password\n").into_response(),
        Err(e) => broken(e),
    }
}

async fn forgot<C: LimitConn + 'static>(
    State(app): State<Arc<App<C>>>,
    Form(form): Form<ForgotForm>,
) -> Response {
    match app.limiter.hit(&app.forgot, &Key::email(&form.email)).await {
        Ok(verdict) if verdict.is_refused() => too_many(&verdict),
        // Here the service would send the email with a code.
        Ok(_) => (
            StatusCode::ACCEPTED,
            "if the account exists, a code is on its way\n",
        )
            .into_response(),
        Err(e) => broken(e),
    }
}

async fn reset<C: LimitConn + 'static>(
    State(app): State<Arc<App<C>>>,
    Form(form): Form<ResetForm>,
) -> Response {
    let account = Key::email(&form.email);
    match app.limiter.check(&app.reset_code, &account).await {
        Ok(verdict) if verdict.is_refused() => return too_many(&verdict),
        Ok(_) => {}
        Err(e) => return broken(e),
    }
    if form.code == "424242" {
        return (StatusCode::OK, "password changed\n").into_response();
    }
    match app.limiter.failed(&app.reset_code, &account).await {
        Ok(verdict) if verdict.is_refused() => too_many(&verdict),
        Ok(_) => (StatusCode::UNAUTHORIZED, "wrong code\n").into_response(),
        Err(e) => broken(e),
    }
}

async fn metrics<C: LimitConn + 'static>(State(app): State<Arc<App<C>>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

#[allow(
    dead_code,
    reason = "the integration test includes this file without its main"
)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let metrics = install_metrics();
    let server = platformkit_limit_testdb::Server::shared();
    let db = server.database(platformkit_limit::SCHEMA).await;
    let manager = deadpool_postgres::Manager::new(db.config(), tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(16)
        .build()?;
    let app = Arc::new(App::new(pool, metrics)?);
    let address = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(app)).await?;
    Ok(())
}
