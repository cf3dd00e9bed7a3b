//! The limiter of [`platformkit_limit`] in front of a tower service: [`LimitLayer`], what it
//! answers instead ([`Rejection`]) and the client's address ([`ClientIp`]).
//!
//! Features: `tracing` (on by default), an error event whenever the layer answers 500, never
//! with the key; `axum`, [`client_ip`](client_ip()) also reads axum's `ConnectInfo<SocketAddr>` and
//! [`Rejection`] is an `IntoResponse`.
//!
//! # Behind a tower layer
//!
//! [`LimitLayer`] puts a [`Limiter`] in front of any `http` service (axum,
//! tonic, hyper). Each rule is a limit and a key function over the request head; every rule
//! that gives a key is decided in one statement. The body is never read: a
//! key only the body holds (a login form's account) is reserved in the
//! handler with [`Limiter::reserve`], returning [`Rejection`] to answer as the layer does
//! (`examples/axum_form_login.rs`).
//!
//! Three modes: `hit` counts every request (API quotas); `attempt` reserves
//! the request before the service runs and takes it back when the response
//! says it succeeded, so only failures count, without the race between
//! `check` and `failed`; `hit_all_or_nothing` counts a request under every
//! rule only if every rule allows it ([all or nothing](platformkit_limit::guide#api-quotas)).
//!
//! What the layer answers:
//!
//! | the request | the answer |
//! |---|---|
//! | every rule allows it, or exempts it (a key function's `None`: a health check, an anonymous user of a per-user limit) | the service's response |
//! | a limit refuses it by its count | 429 with `Retry-After` |
//! | a limit refuses with no count: the store unreachable, the limit [`WhenUnreachable::Refuse`](platformkit_limit::WhenUnreachable::Refuse) | 503 |
//! | shed: the store up and overloaded ([down or overloaded](platformkit_limit::guide#down-or-overloaded)) | 503 with `Retry-After: 1` |
//! | its cost is above a limit's max | 413 (`Rejection::TooLarge`), nothing counted, no `Retry-After` |
//! | a `require` rule's key is missing (a login without its account) | 400 (`Rejection::MissingKey`), nothing counted |
//! | a per-address rule finds no client address | 500, with a body and an error event that say how to hand the address over |
//! | a hard [`Error`](platformkit_limit::Error), a tier that is not the rule's limit under another max, one pair twice in `hit_all_or_nothing` | 500 and an error event |
//!
//! Never a silent allow ([fail-open](platformkit_limit::guide#fail-open)). `on_rejection`
//! replaces an answer; the layer still adds `Retry-After` to a refusal. In front of a tonic
//! service, `grpc()` answers as a gRPC client reads it: the statuses
//! `RESOURCE_EXHAUSTED` (429), `FAILED_PRECONDITION` (413), `UNAVAILABLE`
//! (503), `INVALID_ARGUMENT` (400) and `INTERNAL` (500), the fields as
//! metadata; in `attempt` mode a call that fails with a gRPC status counts. The IETF
//! `RateLimit-Policy` and `RateLimit` fields are sent only for the limits the
//! layer is told to advertise: on a per-account limit they would tell an
//! attacker how many guesses are left. The key is never sent.
//!
//! **The client's address** is what the deployment resolved: axum's
//! `ConnectInfo` (serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`), or a
//! [`ClientIp`] your own middleware sets. The layer
//! never reads `X-Forwarded-For`: any client can write it, and which hop to
//! believe (how many proxies, at which addresses) only the deployment knows.
//! `ClientIp`'s docs show a middleware that believes the header only from
//! the proxy's own addresses.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]

mod builder;
mod client_ip;

mod service;

use std::fmt;
use std::sync::Arc;

use platformkit_limit::{Limiter, Store};

pub use self::client_ip::{ClientIp, client_ip};
pub use self::service::LimitService;
use self::service::{Config, Mode};
pub use self::service::{DefaultOnRejection, GrpcOnRejection, OnRejection, Rejection};

/// A [tower `Layer`](tower::Layer) that limits requests before they reach the service, with a
/// [`Limiter`] shared by every replica.
///
/// Each rule is a [`Limit`](platformkit_limit::Limit) and a key read from the request head. A
/// request that passes reaches the service with the [`Verdicts`](platformkit_limit::Verdicts) in
/// its extensions; any other is answered as its [`Rejection`] says. Modes, statuses, headers,
/// costs and tiers: [behind a tower layer](crate#behind-a-tower-layer).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use axum::Router;
/// use axum::body::Body;
/// use axum::http::{Request, StatusCode, request::Parts};
/// use axum::routing::get;
/// use platformkit_limit_tower::LimitLayer;
/// use platformkit_limit::{Key, Limit, Limiter, ManualClock, Memory};
/// use std::time::UNIX_EPOCH;
/// use tower::ServiceExt as _;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// // In production: Limiter::new(Postgres::new(pool)), built once. Here the
/// // clock is pinned to the start of a minute, so the fields are exact.
/// let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
/// let limiter = Arc::new(Limiter::new(Memory::new().with_clock(clock)));
/// let quota = Limit::new("api", 2, Duration::from_secs(60))?;
/// // Who is counted: the tenant your gateway names. No header, no limit.
/// let tenant = |head: &Parts| {
///     let tenant = head.headers.get("x-tenant")?.to_str().ok()?;
///     Some(Key::opaque(tenant))
/// };
/// let app = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(LimitLayer::hit(limiter).limit(&quota, tenant).advertise(&quota));
///
/// let ask = || Request::get("/").header("x-tenant", "acme").body(Body::empty());
/// for left in [1, 0] {
///     let response = app.clone().oneshot(ask()?).await?;
///     assert_eq!(response.status(), StatusCode::OK);
///     assert_eq!(response.headers()["ratelimit"], format!(r#""api";r={left};t=60"#));
/// }
/// let refused = app.clone().oneshot(ask()?).await?;
/// assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert!(refused.headers().contains_key("retry-after"));
/// assert_eq!(refused.headers()["ratelimit-policy"], r#""api";q=2;w=60"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct LimitLayer<S, R = DefaultOnRejection> {
    config: Config<S, R>,
}

impl<S: Store> LimitLayer<S> {
    /// A layer where every request counts under each rule, allowed or not ([`Limiter::hit`]):
    /// an API quota, a "forgot my password" route.
    pub fn hit(limiter: impl Into<Arc<Limiter<S>>>) -> Self {
        Self::with_mode(limiter.into(), Mode::Hit)
    }

    /// A layer where a request counts under every rule only if every rule allows it
    /// ([`Limiter::hit_all_or_nothing`]). The same limit and key twice for one request is
    /// answered 500 ([`Rejection::Failed`]).
    pub fn hit_all_or_nothing(limiter: impl Into<Arc<Limiter<S>>>) -> Self {
        Self::with_mode(limiter.into(), Mode::HitAllOrNothing)
    }

    /// A layer where only failures count: each request is reserved under every rule
    /// ([`Limiter::reserve_all`]) and taken back (as each limit's
    /// [`OnSuccess`](platformkit_limit::OnSuccess) says) before the response goes out when
    /// `succeeded` calls it a success. A failure, a service error or a dropped request stays
    /// counted; so does a `grpc-status` other than 0. A form login that redirects on success and
    /// failure alike needs more than the status.
    ///
    /// ```
    /// use std::net::{IpAddr, Ipv4Addr};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use axum::Router;
    /// use axum::body::Body;
    /// use axum::http::{Request, StatusCode, response};
    /// use axum::routing::post;
    /// use platformkit_limit_tower::{ClientIp, LimitLayer};
    /// use platformkit_limit::{Limit, Limiter, Memory};
    /// use tower::ServiceExt as _;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Arc::new(Limiter::new(Memory::new()));
    /// let per_address = Limit::new("login-address", 2, Duration::from_secs(900))?;
    /// let login = |password: String| async move {
    ///     if password == "right" { StatusCode::OK } else { StatusCode::UNAUTHORIZED }
    /// };
    /// let app = Router::new().route("/login", post(login)).layer(
    ///     LimitLayer::attempt(limiter, |response: &response::Parts| response.status.is_success())
    ///         .limit_per_client_ip(&per_address),
    /// );
    ///
    /// // The address your proxy-aware middleware resolved (or axum's
    /// // ConnectInfo, with the `axum` feature).
    /// let from = ClientIp(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
    /// let try_password = |password: &'static str| {
    ///     Request::post("/login").extension(from).body(Body::from(password))
    /// };
    /// for _ in 0..5 {
    ///     // Successes are taken back: they never use up the limit.
    ///     let ok = app.clone().oneshot(try_password("right")?).await?;
    ///     assert_eq!(ok.status(), StatusCode::OK);
    /// }
    /// for _ in 0..2 {
    ///     let wrong = app.clone().oneshot(try_password("wrong")?).await?;
    ///     assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    /// }
    /// let refused = app.clone().oneshot(try_password("right")?).await?;
    /// assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn attempt(
        limiter: impl Into<Arc<Limiter<S>>>,
        succeeded: impl Fn(&http::response::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self::with_mode(limiter.into(), Mode::Attempt(Arc::new(succeeded)))
    }

    fn with_mode(limiter: Arc<Limiter<S>>, mode: Mode) -> Self {
        LimitLayer {
            config: Config {
                limiter,
                mode,
                rules: Vec::new(),
                cost: None,
                respond: Arc::new(DefaultOnRejection),
            },
        }
    }
}

impl<S, R> Clone for LimitLayer<S, R> {
    fn clone(&self) -> Self {
        LimitLayer {
            config: self.config.clone(),
        }
    }
}

impl<S, R> fmt::Debug for LimitLayer<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<S, R, T> tower::Layer<T> for LimitLayer<S, R> {
    type Service = LimitService<T, S, R>;

    fn layer(&self, inner: T) -> Self::Service {
        LimitService::new(inner, Arc::new(self.config.clone()))
    }
}
