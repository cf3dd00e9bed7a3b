//! A login whose account is in the form body, behind a proxy: the handler
//! limits per account, a layer per client address, and a middleware takes
//! the client's address from the proxy's `X-Forwarded-For` only when the
//! connection comes from that proxy.
//!
//! ```text
//! cargo run --example axum_form_login --features axum   # on 127.0.0.1:3000
//! curl -si -d 'email=alice@example.com&password=guess' localhost:3000/login
//! ```
//!
//! - `POST /login` (form fields `email`, `password`): a handler that
//!   returns `Rejection`. A wrong password counts per account
//!   (`Limiter::reserve`, then `Permit::failed`), a good one is taken back
//!   (`Permit::succeeded`), a refusal answers 429 with `Retry-After`, a
//!   form without an account 400.
//! - In front of it, `LimitLayer::attempt(..).limit_per_client_ip(..)`:
//!   wrong passwords per client address, over every account.
//! - Outermost, the middleware of `ClientIp`'s docs: the address is the
//!   last `X-Forwarded-For` entry when the peer is a trusted proxy, else
//!   the peer. Served with `into_make_service_with_connect_info`, so the
//!   peer is known.
//!
//! `main` starts a throwaway PostgreSQL (or uses `DATABASE_URL`, a superuser
//! URL) with the schema applied; `TRUSTED_PROXIES` (comma-separated
//! addresses) names the proxies, none by default.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Form, Request, State};
use axum::http::{StatusCode, response};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use platformkit_limit::{Key, Limit, Limiter, Reservation, Store};
use platformkit_limit_tower::{ClientIp, LimitLayer, Rejection};
use serde::Deserialize;

/// The limits, made once.
pub struct Limits {
    /// Wrong passwords per account.
    pub account: Limit,
    /// Wrong passwords per client address, over every account.
    pub address: Limit,
}

impl Limits {
    pub fn new() -> Result<Self, platformkit_limit::Error> {
        let window = Duration::from_secs(15 * 60);
        Ok(Limits {
            account: Limit::new("login-account", 3, window)?,
            address: Limit::new("login-address", 20, window)?,
        })
    }
}

/// What the login handler shares.
struct App<S> {
    limiter: Arc<Limiter<S>>,
    login: Limit,
}

/// The proxies this service stands behind: only their header counts.
#[derive(Clone)]
pub struct Proxies(pub Arc<[IpAddr]>);

/// The service: the login, limited per account in the handler and per
/// client address by the layer, the address resolved by
/// [`client_ip_from_proxy`]. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`.
pub fn router<S: Store + Send + Sync + 'static>(
    limiter: Arc<Limiter<S>>,
    limits: Limits,
    proxies: Proxies,
) -> Router {
    let ok = |r: &response::Parts| r.status.is_success();
    let per_address = LimitLayer::attempt(limiter.clone(), ok).limit_per_client_ip(&limits.address);
    let app = Arc::new(App {
        limiter,
        login: limits.account,
    });
    Router::new()
        .route("/login", post(login::<S>).layer(per_address))
        .with_state(app)
        .layer(middleware::from_fn_with_state(
            proxies,
            client_ip_from_proxy,
        ))
}

/// The client's address: the last `X-Forwarded-For` entry when the peer is
/// one of `proxies`, else the peer.
async fn client_ip_from_proxy(
    State(Proxies(proxies)): State<Proxies>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    let forwarded = || {
        let header = request
            .headers()
            .get_all("x-forwarded-for")
            .iter()
            .next_back()?;
        header
            .to_str()
            .ok()?
            .rsplit(',')
            .next()?
            .trim()
            .parse()
            .ok()
    };
    let trusted = proxies.contains(&peer.ip());
    let address = trusted.then(forwarded).flatten().unwrap_or(peer.ip());
    request.extensions_mut().insert(ClientIp(address));
    next.run(request).await
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
}

/// The login: reserved per account before the password work, taken back on
/// success. A refusal and a hard error answer as the layer does.
async fn login<S: Store>(
    State(app): State<Arc<App<S>>>,
    Form(form): Form<LoginForm>,
) -> Result<(StatusCode, &'static str), Rejection> {
    if form.email.trim().is_empty() {
        return Ok((StatusCode::BAD_REQUEST, "name the account\n"));
    }
    let account = Key::email(&form.email);
    let permit = match app.limiter.reserve(&app.login, &account).await? {
        Reservation::Granted(permit) => permit,
        Reservation::Refused(verdict) => return Err(verdict.into()),
    };
    // Stands in for the service's own check (argon2id over its accounts).
    if !(account == Key::email("alice@example.com")
        && form.password == "correct horse battery staple")
    {
        permit.failed();
        return Ok((StatusCode::UNAUTHORIZED, "wrong email or password\n"));
    }
    // A take-back that fails leaves the attempt counted: the safe side.
    let _ = permit.succeeded().await;
    Ok((StatusCode::OK, "welcome\n"))
}

#[allow(
    dead_code,
    reason = "the integration test includes this file without its main"
)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let server = tokio::task::spawn_blocking(platformkit_limit_testdb::Server::shared).await?;
    let db = server.database(platformkit_limit::SCHEMA).await;
    // In a service: Postgres::new(pool), over the service's own pool.
    let limiter = Arc::new(Limiter::new(platformkit_limit::Postgres::new(db.config())));
    let proxies: Vec<IpAddr> = std::env::var("TRUSTED_PROXIES")
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse())
        .collect::<Result<_, _>>()?;
    let app = router(limiter, Limits::new()?, Proxies(proxies.into()));
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
