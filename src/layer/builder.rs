//! [`LimitLayer`]'s builder methods: its rules
//! ([`limit`](LimitLayer::limit), [`require`](LimitLayer::require),
//! [`limit_per_client_ip`](LimitLayer::limit_per_client_ip)),
//! [`advertise`](LimitLayer::advertise) and
//! [`on_rejection`](LimitLayer::on_rejection).

use std::sync::Arc;

use http::request::Parts;

use super::LimitLayer;
use super::config::{Config, KeyOf, Rule};
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
