//! An axum login over a tokio-postgres deadpool pool, the limiter called in
//! the handler: the account is in the form's body, which a tower layer
//! never reads. (`examples/axum_sqlx.rs` is the service most users run: a
//! layer over an sqlx pool.)
//!
//! ```text
//! cargo run --example axum_login --features deadpool   # on 127.0.0.1:3000
//! curl -si -d 'email=alice@example.com&password=wrong' localhost:3000/login
//! curl -s localhost:3000/metrics
//! ```
//!
//! - `POST /login` (`email`, `password`): `check` before the (simulated)
//!   password work, `failed` after a wrong password, `reset` after a good
//!   one; a refusal answers 429 with `Retry-After`;
//! - `GET /metrics`: the Prometheus exposition.
//!
//! It starts a throwaway PostgreSQL (or uses `DATABASE_URL`, a superuser URL)
//! and applies `schema.sql`; a real service runs `SCHEMA` in its migrations.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use platformkit_limit::{Key, Limit, LimitConn, Limiter, Postgres, Verdict};
use serde::Deserialize;

/// What the routes share.
pub struct App<C> {
    limiter: Limiter<Postgres<C>>,
    login: Limit,
    metrics: PrometheusHandle,
}

impl<C: LimitConn + 'static> App<C> {
    /// The limits of this service, over `conns`.
    pub fn new(conns: C, metrics: PrometheusHandle) -> Result<Self, platformkit_limit::Error> {
        Ok(App {
            limiter: Limiter::new(Postgres::new(conns)),
            login: Limit::new("login", 5, Duration::from_secs(15 * 60))?,
            metrics,
        })
    }
}

/// The router: every route of the service.
pub fn router<C: LimitConn + 'static>(app: Arc<App<C>>) -> Router {
    Router::new()
        .route("/login", post(login::<C>))
        .route("/metrics", get(metrics::<C>))
        .with_state(app)
}

/// A Prometheus recorder.
pub fn install_metrics() -> PrometheusHandle {
    PrometheusBuilder::new()
        .install_recorder()
        .expect("no other recorder is installed")
}

#[derive(Deserialize)]
struct LoginForm {
    email: String,
    password: String,
}

/// The answer to a refused attempt: 429 with Retry-After in whole seconds.
fn too_many(verdict: &Verdict) -> Response {
    let secs = verdict.retry_after_secs().unwrap_or(1);
    let retry_after = [(header::RETRY_AFTER, secs.to_string())];
    (
        StatusCode::TOO_MANY_REQUESTS,
        retry_after,
        "too many attempts\n",
    )
        .into_response()
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
