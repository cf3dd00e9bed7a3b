//! [`LimitLayer`]: the limiter in front of a tower service, keyed by the
//! request head (feature `tower`).

mod client_ip;
mod config;
mod response;
mod service;

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

use crate::store::Store;
use crate::{Key, Limit, Limiter};

pub use self::client_ip::{ClientIp, client_ip};
use self::config::{Config, KeyOf, Mode, Rule};
pub use self::response::{DefaultOnRejection, OnRejection, Rejection};
pub use self::service::LimitService;

/// A [tower `Layer`](tower::Layer) that limits requests before they reach
/// the service, with a [`Limiter`] shared by every replica.
///
/// Each rule is a [`Limit`] and whose key it counts, read from the request
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
/// passes without a call.
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
/// use platformkit_limit::{Key, Limit, LimitLayer, Limiter, ManualClock, Memory};
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
    /// use platformkit_limit::{ClientIp, Limit, LimitLayer, Limiter, Memory};
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
                respond: Arc::new(DefaultOnRejection),
            },
        }
    }
}

impl<S, R> LimitLayer<S, R> {
    /// Adds a rule: `limit`, counted per the key `key` reads from the
    /// request head.
    ///
    /// **`None` exempts the request from this rule**, unlimited by it: for
    /// an internal caller, a health check, an anonymous user of a per-user
    /// limit. A key every limited request must have (a login's account)
    /// is a rule for [`require`](LimitLayer::require), which answers 400
    /// where this one lets the request through.
    ///
    /// # Panics
    ///
    /// Beyond [`Limiter::MAX_PAIRS`] rules, the most one statement takes.
    pub fn limit(
        self,
        limit: &Limit,
        key: impl Fn(&Parts) -> Option<Key> + Send + Sync + 'static,
    ) -> Self {
        self.rule(limit, KeyOf::Head(Arc::new(key)))
    }

    /// Adds a rule: `limit`, counted per the key `key` reads from the
    /// request head, which every request must have: a request for which
    /// `key` gives `None` is answered 400 Bad Request
    /// ([`Rejection::MissingKey`], replaceable with
    /// [`on_rejection`](LimitLayer::on_rejection)), before the service runs
    /// and without a count. Never an unlimited attempt, where
    /// [`limit`](LimitLayer::limit) would exempt it.
    ///
    /// ```
    /// use axum::Router;
    /// use axum::body::Body;
    /// use axum::http::{Request, StatusCode, request::Parts, response};
    /// use axum::routing::post;
    /// use platformkit_limit::{Key, Limit, LimitLayer, Limiter, Memory};
    /// use std::time::Duration;
    /// use tower::ServiceExt as _;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(Memory::new());
    /// let login = Limit::new("login", 5, Duration::from_secs(15 * 60))?;
    /// let account = |head: &Parts| Some(Key::email(head.headers.get("x-account")?.to_str().ok()?));
    /// let ok = |r: &response::Parts| r.status.is_success();
    /// let logins = LimitLayer::attempt(limiter, ok).require(&login, account);
    /// let app = Router::new().route("/login", post(|| async { "welcome" })).layer(logins);
    ///
    /// let anonymous = app.oneshot(Request::post("/login").body(Body::empty())?).await?;
    /// assert_eq!(anonymous.status(), StatusCode::BAD_REQUEST);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Panics
    ///
    /// Beyond [`Limiter::MAX_PAIRS`] rules.
    pub fn require(
        self,
        limit: &Limit,
        key: impl Fn(&Parts) -> Option<Key> + Send + Sync + 'static,
    ) -> Self {
        self.rule(limit, KeyOf::Required(Arc::new(key)))
    }

    /// Adds a rule: `limit`, counted per client address ([`Key::ip`]: an
    /// IPv6 address counts as its /64), the address being [`client_ip`]'s.
    /// Why the address never comes from `X-Forwarded-For`, and a
    /// middleware for a service behind a proxy, are on [`ClientIp`].
    ///
    /// # Serve with the address
    ///
    /// The layer cannot see at build time how the service will be served,
    /// so hand it the address one of two ways:
    ///
    /// - clients connect directly: with the `axum` feature, serve with
    ///   `axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())`;
    /// - behind a proxy: insert a [`ClientIp`] before this layer, from
    ///   the header your proxy sets, only when the peer is that proxy.
    ///
    /// A request that carries no address is never let through: it is
    /// answered 500 ([`Rejection::NoClientAddress`]) with a body that says
    /// the above, and (feature `tracing`) an error event naming the limit,
    /// from the first request on.
    ///
    /// # Panics
    ///
    /// Beyond [`Limiter::MAX_PAIRS`] rules.
    pub fn limit_per_client_ip(self, limit: &Limit) -> Self {
        self.rule(limit, KeyOf::ClientIp)
    }

    fn rule(mut self, limit: &Limit, key: KeyOf) -> Self {
        assert!(
            self.config.rules.len() < Limiter::MAX_PAIRS,
            "a LimitLayer takes at most {} rules, the most one statement takes",
            Limiter::MAX_PAIRS
        );
        self.config.rules.push(Rule {
            limit: limit.clone(),
            key,
            advertised: false,
        });
        self
    }

    /// Sends the IETF `RateLimit-Policy` and `RateLimit` fields for the
    /// rules of `limit` (by its name), on every response they decided:
    /// what is left and when the window resets, rendered by
    /// [`Limit::policy_field`] and
    /// [`Verdict::rate_limit_field`](crate::Verdict::rate_limit_field). In
    /// attempt mode `r` is what was left when the attempt was reserved.
    ///
    /// Off unless asked for, and meant for limits whose counts are the
    /// client's own business (an API quota): on a per-account login limit
    /// they tell an attacker how many guesses are left, the draft's own
    /// warning. The key is never sent.
    ///
    /// # Panics
    ///
    /// When no rule has this limit's name: add the rule first.
    pub fn advertise(mut self, limit: &Limit) -> Self {
        let mut found = false;
        for rule in &mut self.config.rules {
            if rule.limit.name() == limit.name() {
                rule.advertised = true;
                found = true;
            }
        }
        assert!(
            found,
            "advertise: no rule of this layer has the limit {:?}; add it with limit() first",
            limit.name()
        );
        self
    }

    /// Replaces the answers to a refusal (429), an unreachable store that
    /// refuses (503), a missing [required](LimitLayer::require) key (400),
    /// no client address and a hard error (500) with what `respond` makes
    /// of the [`Rejection`]: a JSON problem, a page. The layer adds `Retry-After`
    /// to a refusal, and the fields of the [advertised](LimitLayer::advertise)
    /// limits, when the response lacks them.
    ///
    /// ```
    /// use axum::body::Body;
    /// use axum::http::{Response, header};
    /// use platformkit_limit::{LimitLayer, Limiter, Memory, Rejection};
    ///
    /// let layer = LimitLayer::hit(Limiter::new(Memory::new())).on_rejection(
    ///     |rejection: Rejection| {
    ///         let body = match &rejection {
    ///             Rejection::Refused(verdicts) => format!(
    ///                 r#"{{"error":"too many attempts","limit":{:?}}}"#,
    ///                 verdicts.refused_by().map(|v| v.limit()).unwrap_or_default()
    ///             ),
    ///             _ => r#"{"error":"try again later"}"#.to_owned(),
    ///         };
    ///         Response::builder()
    ///             .status(rejection.status())
    ///             .header(header::CONTENT_TYPE, "application/json")
    ///             .body(Body::from(body))
    ///             .expect("a valid response")
    ///     },
    /// );
    /// # drop(layer);
    /// ```
    pub fn on_rejection<F, B>(self, respond: F) -> LimitLayer<S, F>
    where
        F: Fn(Rejection) -> http::Response<B> + Send + Sync + 'static,
    {
        let Config {
            limiter,
            mode,
            rules,
            respond: _,
        } = self.config;
        LimitLayer {
            config: Config {
                limiter,
                mode,
                rules,
                respond: Arc::new(respond),
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
