//! [`LimitLayer`]'s builder methods: rules, cost, tiers, advertised fields, answers.

use std::sync::Arc;

use http::request::Parts;

use super::LimitLayer;
use super::service::{Config, GrpcOnRejection, KeyOf, Rejection, Rule, TierFn};
use platformkit_limit::{Key, Limit, Limiter};

impl<S, R> LimitLayer<S, R> {
    /// Adds a rule: `limit`, counted per the key `key` reads from the request head. **`None`
    /// exempts the request from this rule** (a health check, an anonymous user); a key every
    /// request must have is for [`require`](LimitLayer::require).
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

    /// Adds a rule (and panics) as [`limit`](LimitLayer::limit) does, for a key every request
    /// must have: one without it is answered 400 ([`Rejection::MissingKey`]), nothing counted.
    pub fn require(
        self,
        limit: &Limit,
        key: impl Fn(&Parts) -> Option<Key> + Send + Sync + 'static,
    ) -> Self {
        self.rule(limit, KeyOf::Required(Arc::new(key)))
    }

    /// Adds a rule (and panics) as [`limit`](LimitLayer::limit) does: `limit`, counted per client
    /// address ([`Key::ip`]) as [`client_ip`](super::client_ip()) finds it; without one, 500
    /// ([`Rejection::NoClientAddress`]), never let through.
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

    /// What each request costs, read from its head (a batch's size); 1 without it. Every rule
    /// counts the whole cost ([API quotas](platformkit_limit::guide#api-quotas)). A cost of 0
    /// passes uncounted, though a missing required key or address is still answered.
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u32 + Send + Sync + 'static) -> Self {
        self.config.cost = Some(Arc::new(cost));
        self
    }

    /// Counts the rules of `limit` (by name) under the tier ([`Limit::with_max`]) `tier` reads
    /// from the head, or under `limit` for `None`; the advertised fields show the tier's max. A
    /// limit that is not a tier of `limit` is answered 500 ([`Rejection::WrongTier`]).
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
        self,
        limit: &Limit,
        tier: impl Fn(&Parts) -> Option<Limit> + Send + Sync + 'static,
    ) -> Self {
        let tier: TierFn = Arc::new(tier);
        self.rules_of(limit, "tier", |rule| rule.tier = Some(tier.clone()))
    }

    /// Sends the IETF `RateLimit-Policy` and `RateLimit` fields ([`Limit::policy_field`],
    /// [`Verdict::rate_limit_field`](platformkit_limit::Verdict::rate_limit_field)) for the rules
    /// of `limit` (by its name) on every response they decided. Off unless asked for: on a
    /// per-account login limit they would tell an attacker how many guesses are left.
    ///
    /// # Panics
    ///
    /// When no rule has this limit's name: add the rule first.
    pub fn advertise(self, limit: &Limit) -> Self {
        self.rules_of(limit, "advertise", |rule| rule.advertised = true)
    }

    /// Sets each rule of `limit` (by its name); panics, naming `method`, when there is none.
    fn rules_of(mut self, limit: &Limit, method: &str, mut set: impl FnMut(&mut Rule)) -> Self {
        let mut found = false;
        for rule in &mut self.config.rules {
            if rule.limit.name() == limit.name() {
                set(rule);
                found = true;
            }
        }
        assert!(
            found,
            "{method}: no rule of this layer has the limit {:?}; add it with limit() first",
            limit.name()
        );
        self
    }

    /// Replaces the layer's answers ([`DefaultOnRejection`](super::DefaultOnRejection)) with
    /// what `respond` makes of the [`Rejection`]. The layer still adds `Retry-After` to a
    /// refusal, and the [advertised](LimitLayer::advertise) fields, when the response lacks them.
    ///
    /// ```
    /// use axum::body::Body;
    /// use axum::http::{Response, header};
    /// use platformkit_limit_tower::{LimitLayer, Rejection};
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
        self.answering(respond)
    }

    /// Answers as a gRPC client understands ([`GrpcOnRejection`]): for a tonic service.
    pub fn grpc(self) -> LimitLayer<S, GrpcOnRejection> {
        self.answering(GrpcOnRejection)
    }

    fn answering<F>(self, respond: F) -> LimitLayer<S, F> {
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
