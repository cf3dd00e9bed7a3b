//! The limiter in front of a tower service (feature `tower`):
//! [`LimitLayer`] limits each request by keys read from its head, before it
//! reaches an `http` service (axum, tonic, hyper); [`Rejection`] is what it
//! answers instead, and [`ClientIp`] the client's address it keys by. What
//! the layer does and why is in the guide's
//! [Behind a tower layer](crate::guide#behind-a-tower-layer).

mod builder;
mod client_ip;
mod config;
mod response;
mod service;

use std::fmt;
use std::sync::Arc;

use crate::Limiter;
use crate::store::Store;

pub use self::client_ip::{ClientIp, client_ip};
use self::config::{Config, Mode};
pub use self::response::{DefaultOnRejection, OnRejection, Rejection};
pub use self::service::LimitService;

/// A [tower `Layer`](tower::Layer) that limits requests before they reach
/// the service, with a [`Limiter`] shared by every replica.
///
/// Each rule is a [`Limit`](crate::Limit) and whose key it counts, read from the request
/// head (the body is never read):
///
/// | the rule | a request without its key |
/// |---|---|
/// | [`limit`](LimitLayer::limit)`(&limit, key_fn)` | **exempt** from this rule: `None` is an exemption, on purpose (a health check, an anonymous caller of a per-user limit) |
/// | [`require`](LimitLayer::require)`(&limit, key_fn)` | 400 ([`Rejection::MissingKey`]), nothing counted: a login without its account |
/// | [`limit_per_client_ip`](LimitLayer::limit_per_client_ip)`(&limit)` | 500 ([`Rejection::NoClientAddress`]) and an error event: the service forgot to hand the layer the address |
///
/// A key function is `Fn(&http::request::Parts) -> Option<Key>`. Every rule
/// that gives a key is decided in **one statement** ([`Limiter::hit_all`] or
/// [`Limiter::reserve_all`]; a single key goes through `hit` or `reserve`,
/// refusal cache and merging included). A request every rule exempts
/// passes without a call. Each request costs 1, or what
/// [`cost`](LimitLayer::cost) reads from its head ([`Limiter::hit_all_n`],
/// [`Limiter::reserve_all_n`]), and a rule may count it under a
/// [`tier`](LimitLayer::tier) of its limit the request names (a plan).
///
/// Two modes:
///
/// - [`LimitLayer::hit`]: every request counts, as for an API quota;
/// - [`LimitLayer::attempt`]: the request is reserved before the service
///   runs and taken back when the response says it succeeded, so only
///   failures count (a login). There is no check-then-record race: a
///   thousand concurrent requests cannot all pass before the first failure
///   is written.
///
/// What the layer answers:
///
/// | the verdicts | the answer |
/// |---|---|
/// | every limit allows (or the store is unreachable and the limit allows) | the service's response |
/// | a limit refuses by its count | 429 with `Retry-After` in whole seconds, rounded up ([`Verdicts::retry_after_secs`](crate::Verdicts::retry_after_secs)) |
/// | refused with no count: the store is unreachable and a limit has [`WhenUnreachable::Refuse`](crate::WhenUnreachable::Refuse) | 503 |
/// | shed: the store is up and too busy to answer within the budget (a flood, a full pool; [down or overloaded](crate::guide#down-or-overloaded)) | 503 with `Retry-After: 1` ([`Verdict::SHED_RETRY_AFTER`](crate::Verdict::SHED_RETRY_AFTER)) |
/// | the request's [cost](LimitLayer::cost) is above a limit's max: no window ever allows it | 413, nothing counted, no `Retry-After` |
/// | a [required](LimitLayer::require) key is missing | 400, nothing counted |
/// | no client address for [`limit_per_client_ip`](LimitLayer::limit_per_client_ip) | 500 saying how to fix it, and an error event naming the limit (feature `tracing`); never a silent allow |
/// | a hard [`Error`](crate::Error) (a misconfiguration) | 500, and an error event; never a silent allow |
///
/// [`on_rejection`](LimitLayer::on_rejection) replaces these answers with
/// your own; the layer still adds `Retry-After` to a refusal that lacks it.
/// The service sees the [`Verdicts`](crate::Verdicts) in the request's
/// extensions (after those of any limit layer outside this one), so a
/// handler can say "3 attempts left". The IETF `RateLimit-Policy` and
/// `RateLimit` fields are sent only for the limits you
/// [`advertise`](LimitLayer::advertise).
///
/// A key the head does not hold (a login's account, in the form body)
/// belongs in the handler, with [`Limiter::reserve`]: [`Rejection`] shows
/// that handler, which answers as the layer does. The layer takes what the
/// head holds: the client's address, an authenticated user an earlier
/// layer put in the extensions, an API tenant.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use axum::Router;
/// use axum::body::Body;
/// use axum::http::{Request, StatusCode, request::Parts};
/// use axum::routing::get;
/// use platformkit_limit::layer::LimitLayer;
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
    /// A layer where every request counts under each rule, allowed or not
    /// ([`Limiter::hit`]): an API quota, a "forgot my password" route.
    /// Add rules with [`limit`](LimitLayer::limit).
    pub fn hit(limiter: impl Into<Arc<Limiter<S>>>) -> Self {
        Self::with_mode(limiter.into(), Mode::Hit)
    }

    /// A layer where a request counts under every rule only if every rule
    /// allows it, and under none if one refuses
    /// ([`Limiter::hit_all_or_nothing`]): API quotas, where a refusal by
    /// the per-second rule must not spend the per-day one. As
    /// [`hit`](LimitLayer::hit) otherwise: the cost, the tiers, the
    /// answers and the RateLimit fields. Two rules of one limit with the
    /// same key for a request are answered 500
    /// ([`Rejection::Failed`]): each rule
    /// is decided by its own count.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use axum::Router;
    /// use axum::body::Body;
    /// use axum::http::{Request, StatusCode, request::Parts};
    /// use axum::routing::get;
    /// use platformkit_limit::layer::LimitLayer;
    /// use platformkit_limit::{Key, Limit, Limiter, Memory};
    /// use tower::ServiceExt as _;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Arc::new(Limiter::new(Memory::new()));
    /// let per_minute = Limit::new("api-minute", 2, Duration::from_secs(60))?;
    /// let per_day = Limit::new("api-day", 1_000, Duration::from_secs(86_400))?;
    /// let tenant = |head: &Parts| Some(Key::opaque(head.headers.get("x-tenant")?.to_str().ok()?));
    /// let app = Router::new().route("/", get(|| async { "hello" })).layer(
    ///     LimitLayer::hit_all_or_nothing(limiter.clone())
    ///         .limit(&per_minute, tenant)
    ///         .limit(&per_day, tenant)
    ///         .advertise(&per_day),
    /// );
    ///
    /// let ask = || Request::get("/").header("x-tenant", "acme").body(Body::empty());
    /// for _ in 0..3 {
    ///     app.clone().oneshot(ask()?).await?;
    /// }
    /// // The third was refused by the minute, and spent nothing of the day.
    /// let day = limiter.check(&per_day, &Key::opaque("acme")).await?;
    /// assert_eq!(day.count(), Some(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn hit_all_or_nothing(limiter: impl Into<Arc<Limiter<S>>>) -> Self {
        Self::with_mode(limiter.into(), Mode::HitAllOrNothing)
    }

    /// A layer where only failures count: each request is reserved under
    /// every rule before the service runs ([`Limiter::reserve_all`]), and
    /// taken back when `succeeded` says the response is a success (each
    /// limit's [`OnSuccess`](crate::OnSuccess) says how). A request whose
    /// response is not a success, whose service fails, or which is dropped
    /// midway stays counted: the safe side.
    ///
    /// The take-back is one more statement per limit, awaited before the
    /// response goes out, so the client's next request sees it. Say what
    /// success is for your route: a form login that redirects on success
    /// and on failure alike needs more than the status.
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
    /// use platformkit_limit::layer::{ClientIp, LimitLayer};
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
