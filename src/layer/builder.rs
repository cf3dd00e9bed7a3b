//! [`LimitLayer`]'s builder methods: its rules
//! ([`limit`](LimitLayer::limit), [`require`](LimitLayer::require),
//! [`limit_per_client_ip`](LimitLayer::limit_per_client_ip)),
//! [`cost`](LimitLayer::cost), [`tier`](LimitLayer::tier),
//! [`advertise`](LimitLayer::advertise) and
//! [`on_rejection`](LimitLayer::on_rejection).

use std::sync::Arc;

use http::request::Parts;

use super::LimitLayer;
use super::config::{Config, KeyOf, Rule, TierFn};
use super::response::Rejection;
use crate::{Key, Limit, Limiter};

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
    /// use platformkit_limit::layer::LimitLayer;
    /// use platformkit_limit::{Key, Limit, Limiter, Memory};
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
    /// IPv6 address counts as its /64), the address being
    /// [`client_ip`](super::client_ip())'s.
    /// Why the address never comes from `X-Forwarded-For`, and a
    /// middleware for a service behind a proxy, are on [`ClientIp`](super::ClientIp).
    ///
    /// # Serve with the address
    ///
    /// The layer cannot see at build time how the service will be served,
    /// so hand it the address one of two ways:
    ///
    /// - clients connect directly: with the `axum` feature, serve with
    ///   `axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())`;
    /// - behind a proxy: insert a [`ClientIp`](super::ClientIp) before this layer, from
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
            tier: None,
        });
        self
    }

    /// What each request costs, read from its head (a batch's size from a
    /// header, an upload's `Content-Length`): every rule counts it, in the
    /// one statement ([`Limiter::hit_all_n`]; in attempt mode
    /// [`Limiter::reserve_all_n`], a success taking the whole cost back).
    /// Without it, every request costs 1.
    ///
    /// - **A cost of 0 is free**: the request passes without a call and
    ///   nothing is counted, as one that every rule exempts (a rejection
    ///   for a missing [required](LimitLayer::require) key or client
    ///   address still comes first). A cost read from what the client
    ///   sends should be at least 1 unless free is meant: `.max(1)`.
    /// - **A cost above a rule's max** is answered 413 Content Too Large
    ///   ([`Rejection::TooLarge`]), nothing counted and no `Retry-After`:
    ///   no window ever allows it, so waiting would not help, where 429
    ///   says to wait.
    ///
    /// ```
    /// use axum::Router;
    /// use axum::body::Body;
    /// use axum::http::{Request, StatusCode, request::Parts};
    /// use axum::routing::post;
    /// use platformkit_limit::layer::LimitLayer;
    /// use platformkit_limit::{Key, Limit, Limiter, Memory};
    /// use std::time::Duration;
    /// use tower::ServiceExt as _;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let quota = Limit::new("api", 100, Duration::from_secs(60))?;
    /// let tenant = |head: &Parts| Some(Key::opaque(head.headers.get("x-tenant")?.to_str().ok()?));
    /// // A batch costs its number of items; a request that names none, 1.
    /// let items = |head: &Parts| {
    ///     let items = head.headers.get("x-items").and_then(|v| v.to_str().ok()?.parse().ok());
    ///     items.unwrap_or(1).max(1)
    /// };
    /// let layer = LimitLayer::hit(Limiter::new(Memory::new())).limit(&quota, tenant).cost(items);
    /// let app = Router::new().route("/batch", post(|| async { "done" })).layer(layer);
    /// let batch = |n: u32| {
    ///     let ask = Request::post("/batch").header("x-tenant", "acme").header("x-items", n);
    ///     ask.body(Body::empty())
    /// };
    ///
    /// assert_eq!(app.clone().oneshot(batch(60)?).await?.status(), StatusCode::OK);
    /// // 60 + 50 would pass 100.
    /// assert_eq!(app.clone().oneshot(batch(50)?).await?.status(), StatusCode::TOO_MANY_REQUESTS);
    /// // No window ever allows 101.
    /// assert_eq!(app.clone().oneshot(batch(101)?).await?.status(), StatusCode::PAYLOAD_TOO_LARGE);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u32 + Send + Sync + 'static) -> Self {
        self.config.cost = Some(Arc::new(cost));
        self
    }

    /// Counts the rules of `limit` (by its name) under the tier `tier`
    /// reads from each request's head, typically from an extension the
    /// authentication layer set (the caller's plan): a tier is `limit`
    /// under another max, made once with [`Limit::with_max`], so every
    /// tier counts in one row per key and a caller moved from one tier to
    /// another keeps its count. `None` counts the request under `limit`
    /// itself. The [advertised](LimitLayer::advertise) fields show the
    /// tier's quota: `q` in `RateLimit-Policy` and `r` in `RateLimit` are
    /// its max's.
    ///
    /// A tier that is not `limit` under another max (another name, window,
    /// strategy, lockout or setting: another count) is a mistake of the
    /// service's: answered 500 ([`Rejection::Failed`], with
    /// [`ErrorKind::InvalidLimit`](crate::ErrorKind::InvalidLimit)) and an
    /// error event, never a silent allow.
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
    /// /// What the authentication layer puts in the extensions.
    /// #[derive(Clone)]
    /// struct Caller { id: String, paid: bool }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let free = Limit::new("api", 1, Duration::from_secs(3600))?;
    /// let paid = free.with_max(1000)?;
    /// let caller = |head: &Parts| Some(Key::opaque(&head.extensions.get::<Caller>()?.id));
    /// let plan = move |head: &Parts| head.extensions.get::<Caller>()?.paid.then(|| paid.clone());
    /// let layer = LimitLayer::hit(Arc::new(Limiter::new(Memory::new())))
    ///     .limit(&free, caller)
    ///     .tier(&free, plan)
    ///     .advertise(&free);
    /// let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// let ask = |paid: bool| {
    ///     Request::get("/").extension(Caller { id: "c-9".into(), paid }).body(Body::empty())
    /// };
    ///
    /// assert_eq!(app.clone().oneshot(ask(false)?).await?.status(), StatusCode::OK);
    /// assert_eq!(app.clone().oneshot(ask(false)?).await?.status(), StatusCode::TOO_MANY_REQUESTS);
    /// // Upgraded: the same count (3 with this request), under the paid max.
    /// let upgraded = app.clone().oneshot(ask(true)?).await?;
    /// assert_eq!(upgraded.status(), StatusCode::OK);
    /// assert_eq!(upgraded.headers()["ratelimit-policy"], r#""api";q=1000;w=3600"#);
    /// assert!(upgraded.headers()["ratelimit"].to_str()?.starts_with(r#""api";r=997;"#));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Panics
    ///
    /// When no rule has this limit's name: add the rule first.
    pub fn tier(
        mut self,
        limit: &Limit,
        tier: impl Fn(&Parts) -> Option<Limit> + Send + Sync + 'static,
    ) -> Self {
        let tier: TierFn = Arc::new(tier);
        let mut found = false;
        for rule in &mut self.config.rules {
            if rule.limit.name() == limit.name() {
                rule.tier = Some(tier.clone());
                found = true;
            }
        }
        assert!(
            found,
            "tier: no rule of this layer has the limit {:?}; add it with limit() first",
            limit.name()
        );
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
    /// use platformkit_limit::layer::{LimitLayer, Rejection};
    /// use platformkit_limit::{Limiter, Memory};
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
            cost,
            respond: _,
        } = self.config;
        LimitLayer {
            config: Config {
                limiter,
                mode,
                rules,
                cost,
                respond: Arc::new(respond),
            },
        }
    }
}
