//! One request's path through the layer: [`Config`], each request's keys and cost,
//! [`LimitService`], what it answers instead of the service ([`Rejection`]), the fields it adds.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use tower::Service;

use super::client_ip::client_ip;
use platformkit_limit::{Error, Key, Limit, Limiter, Reservations, Store, Verdict, Verdicts};

/// The service [`LimitLayer`](super::LimitLayer) wraps around yours.
pub struct LimitService<T, S, R = DefaultOnRejection> {
    inner: T,
    config: Arc<Config<S, R>>,
}

impl<T, S, R> LimitService<T, S, R> {
    pub(super) fn new(inner: T, config: Arc<Config<S, R>>) -> Self {
        LimitService { inner, config }
    }
}

impl<T: Clone, S, R> Clone for LimitService<T, S, R> {
    fn clone(&self) -> Self {
        LimitService {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<T: fmt::Debug, S, R> fmt::Debug for LimitService<T, S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitService")
            .field("inner", &self.inner)
            .field("layer", &self.config)
            .finish()
    }
}

impl<T, S, R, ReqBody, ResBody> Service<Request<ReqBody>> for LimitService<T, S, R>
where
    T: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    T::Future: Send,
    S: Store + 'static,
    R: OnRejection<ResBody>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = T::Error;
    // Boxed: it holds the limiter's call and a permit, both borrowing the shared limiter.
    type Future = BoxFuture<'static, Result<Response<ResBody>, T::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service polled ready serves this request; its clone stays for the next one.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let (head, body) = request.into_parts();
        let keys = config.keys(&head);
        let cost = config.cost(&head);
        let request = Request::from_parts(head, body);
        Box::pin(serve(config, inner, request, (keys, cost)))
    }
}

/// Decides the request, then runs the service or answers in its place.
async fn serve<T, S, R, ReqBody, ResBody>(
    config: Arc<Config<S, R>>,
    mut inner: T,
    mut request: Request<ReqBody>,
    (keys, cost): (Result<Vec<Asked>, Rejection>, u32),
) -> Result<Response<ResBody>, T::Error>
where
    T: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S: Store,
    R: OnRejection<ResBody>,
{
    let keys = match keys {
        Ok(keys) => keys,
        Err(rejection) => return Ok(rejection.answer(&*config.respond, Fields::default())),
    };
    // A cost of 0 is free: as a request every rule exempts.
    let Some(cost) = NonZeroU32::new(cost).filter(|_| !keys.is_empty()) else {
        return inner.call(request).await;
    };
    let pairs: Vec<(&Limit, &Key)> = keys.iter().map(|a| (&a.limit, &a.key)).collect();
    let limiter = &*config.limiter;
    match &config.mode {
        Mode::Hit | Mode::HitAllOrNothing => {
            let verdicts = if let Mode::Hit = config.mode {
                limiter.hit_all(&pairs).cost(cost).await
            } else {
                limiter.hit_all_or_nothing(&pairs).cost(cost).await
            };
            let verdicts = match verdicts {
                Ok(verdicts) => verdicts,
                Err(e) => {
                    return Ok(Rejection::Failed(e).answer(&*config.respond, Fields::default()));
                }
            };
            if verdicts.is_refused() {
                return Ok(config.refused(&keys, verdicts));
            }
            let fields = config.fields(&keys, &verdicts);
            attach(&mut request, verdicts);
            let mut response = inner.call(request).await?;
            fields.add_to(response.headers_mut());
            Ok(response)
        }
        Mode::Attempt(succeeded) => {
            let permits = match limiter.reserve_all(&pairs).cost(cost).await {
                Ok(Reservations::Granted(permits)) => permits,
                Ok(Reservations::Refused(verdicts)) => return Ok(config.refused(&keys, verdicts)),
                Err(e) => {
                    return Ok(Rejection::Failed(e).answer(&*config.respond, Fields::default()));
                }
            };
            let fields = config.fields(&keys, permits.verdicts());
            attach(&mut request, permits.verdicts().clone());
            // An error from the service drops the permits: counted.
            let response = inner.call(request).await?;
            let (mut head, body) = response.into_parts();
            // A gRPC call's failure is HTTP 200 with a grpc-status other than 0: never a success.
            let grpc_failed = head
                .headers
                .get("grpc-status")
                .is_some_and(|status| status != "0");
            if succeeded(&head) && !grpc_failed {
                if let Err(e) = permits.succeeded().await {
                    take_back_failed(&e);
                }
            } else {
                permits.failed();
            }
            fields.add_to(&mut head.headers);
            Ok(Response::from_parts(head, body))
        }
    }
}

/// Puts the verdicts in the request's extensions, after those of a limit layer outside this one.
fn attach<B>(request: &mut Request<B>, verdicts: Verdicts) {
    let verdicts = match request.extensions_mut().remove::<Verdicts>() {
        Some(outer) => {
            let mut all = outer.into_vec();
            all.extend(verdicts.into_vec());
            Verdicts::from(all)
        }
        None => verdicts,
    };
    request.extensions_mut().insert(verdicts);
}

impl<S, R> Config<S, R> {
    /// The header fields for the advertised rules among `keys`, each under its limit (the tier).
    fn fields(&self, keys: &[Asked], verdicts: &Verdicts) -> Fields {
        let mut fields = Fields::default();
        let mut named: Vec<&str> = Vec::new();
        for (asked, verdict) in keys.iter().zip(verdicts) {
            let rule = &self.rules[asked.rule];
            // One item per limit, the first rule's, should a limit be given twice.
            if !rule.advertised || named.contains(&rule.limit.name()) {
                continue;
            }
            named.push(rule.limit.name());
            // Both fields or neither: a policy alone would tell that the store is down or busy.
            if let Some(field) = verdict.rate_limit_field() {
                fields.policy.push(asked.limit.policy_field());
                fields.rate_limit.push(field);
            }
        }
        fields
    }

    /// The answer to verdicts that refuse.
    fn refused<B>(&self, keys: &[Asked], verdicts: Verdicts) -> Response<B>
    where
        R: OnRejection<B>,
    {
        let mut fields = self.fields(keys, &verdicts);
        fields.retry_after = verdicts.retry_after_secs();
        Rejection::of(verdicts).answer(&*self.respond, fields)
    }
}

/// A key function: who a rule counts, read from the request head.
pub(super) type KeyFn = Arc<dyn Fn(&Parts) -> Option<Key> + Send + Sync>;

/// What a request costs, read from its head.
pub(super) type CostFn = Arc<dyn Fn(&Parts) -> u32 + Send + Sync>;

/// The tier a request is counted under, read from its head.
pub(super) type TierFn = Arc<dyn Fn(&Parts) -> Option<Limit> + Send + Sync>;

/// Whether a response says the attempt succeeded.
pub(super) type SucceededFn = Arc<dyn Fn(&http::response::Parts) -> bool + Send + Sync>;

/// What a layer and its services share.
pub(super) struct Config<S, R> {
    pub(super) limiter: Arc<Limiter<S>>,
    pub(super) mode: Mode,
    pub(super) rules: Vec<Rule>,
    /// What a request costs; 1 without it.
    pub(super) cost: Option<CostFn>,
    pub(super) respond: Arc<R>,
}

#[derive(Clone)]
pub(super) enum Mode {
    Hit,
    /// `hit`, counted under every rule only if every rule allows it.
    HitAllOrNothing,
    Attempt(SucceededFn),
}

#[derive(Clone)]
pub(super) struct Rule {
    pub(super) limit: Limit,
    pub(super) key: KeyOf,
    pub(super) advertised: bool,
    /// The tier of each request; the rule's limit without it, or for `None`.
    pub(super) tier: Option<TierFn>,
}

/// One rule's ask for one request: the limit it is counted under is the rule's, or its tier.
pub(super) struct Asked {
    pub(super) rule: usize,
    pub(super) key: Key,
    pub(super) limit: Limit,
}

#[derive(Clone)]
pub(super) enum KeyOf {
    /// A key function; `None` exempts the request from the rule.
    Head(KeyFn),
    /// A key function; `None` is answered 400 ([`Rejection::MissingKey`]).
    Required(KeyFn),
    /// The client's address; none is answered 500 ([`Rejection::NoClientAddress`]).
    ClientIp,
}

impl<S, R> Config<S, R> {
    /// Each rule's ask for this request, exempting rules left out. The first rule that cannot do
    /// without its key and finds none, or whose tier is not its limit, makes the rejection.
    pub(super) fn keys(&self, head: &Parts) -> Result<Vec<Asked>, Rejection> {
        let mut keys = Vec::with_capacity(self.rules.len());
        for (index, rule) in self.rules.iter().enumerate() {
            let key = match &rule.key {
                KeyOf::Head(key) => key(head),
                KeyOf::Required(key) => Some(key(head).ok_or_else(|| Rejection::MissingKey {
                    limit: rule.limit.name().to_owned(),
                })?),
                KeyOf::ClientIp => Some(Key::ip(client_ip(head).ok_or_else(|| {
                    Rejection::NoClientAddress {
                        limit: rule.limit.name().to_owned(),
                    }
                })?)),
            };
            let Some(key) = key else {
                continue;
            };
            let limit = match rule.tier.as_ref().and_then(|tier| tier(head)) {
                Some(tier) if rule.limit.is_tier(&tier) => tier,
                Some(_) => {
                    return Err(Rejection::WrongTier {
                        limit: rule.limit.name().to_owned(),
                    });
                }
                None => rule.limit.clone(),
            };
            keys.push(Asked {
                rule: index,
                key,
                limit,
            });
        }
        Ok(keys)
    }

    /// What the request costs: the cost function's, or 1.
    pub(super) fn cost(&self, head: &Parts) -> u32 {
        self.cost.as_ref().map_or(1, |cost| cost(head))
    }
}

impl<S, R> Clone for Config<S, R> {
    fn clone(&self) -> Self {
        Config {
            limiter: self.limiter.clone(),
            mode: self.mode.clone(),
            rules: self.rules.clone(),
            cost: self.cost.clone(),
            respond: self.respond.clone(),
        }
    }
}

impl<S, R> fmt::Debug for Config<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<_> = self
            .rules
            .iter()
            .map(|rule| {
                let key = match rule.key {
                    KeyOf::Head(_) => "head",
                    KeyOf::Required(_) => "head, required",
                    KeyOf::ClientIp => "client ip",
                };
                (rule.limit.name(), key, rule.advertised, rule.tier.is_some())
            })
            .collect();
        let mode = match self.mode {
            Mode::Hit => "hit",
            Mode::HitAllOrNothing => "hit_all_or_nothing",
            Mode::Attempt(_) => "attempt",
        };
        f.debug_struct("LimitLayer")
            .field("mode", &mode)
            .field("rules", &rules)
            .field("costed", &self.cost.is_some())
            .finish_non_exhaustive()
    }
}

/// Why the layer answered instead of the service (given to `LimitLayer::on_rejection`). With
/// the `axum` feature also an `IntoResponse`, for a handler's `?` (`examples/axum_form_login.rs`).
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// A limit refused by its count ([`Verdicts::refused_by`]): 429 Too Many Requests.
    Refused(Verdicts),
    /// No refusing limit counted (unreachable and
    /// [`Refuse`](platformkit_limit::WhenUnreachable::Refuse), or
    /// [shed](platformkit_limit::Verdicts::is_shed)): 503 Service Unavailable.
    Unavailable(Verdicts),
    /// The ask's cost is above a limit's max ([`Verdict::exceeds_max`]): 413 Content Too Large,
    /// without `Retry-After`, nothing counted.
    TooLarge(Verdicts),
    /// A [required](super::LimitLayer::require) key is missing: 400 Bad Request, nothing counted.
    MissingKey {
        /// The name of the rule's limit.
        limit: String,
    },
    /// A [per-address rule](super::LimitLayer::limit_per_client_ip) found no client address:
    /// 500 Internal Server Error and an error event; the default body says how to fix it.
    NoClientAddress {
        /// The name of the rule's limit.
        limit: String,
    },
    /// A rule's [tier](super::LimitLayer::tier) is not its limit under another max: 500 Internal
    /// Server Error and an error event.
    WrongTier {
        /// The name of the rule's limit.
        limit: String,
    },
    /// A hard error (a missing table or privilege): 500 Internal Server Error and an error event.
    Failed(Error),
}

/// How to hand a per-address rule the client's address: the default body and the event say it.
macro_rules! no_client_address {
    () => {
        "a per-address limit found no client address: serve with \
         into_make_service_with_connect_info::<SocketAddr>(), or set a ClientIp from a \
         trusted proxy before the layer"
    };
}

impl Rejection {
    /// The status of the layer's own answer ([`DefaultOnRejection`]).
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Refused(_) => StatusCode::TOO_MANY_REQUESTS,
            Rejection::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::MissingKey { .. } => StatusCode::BAD_REQUEST,
            Rejection::NoClientAddress { .. }
            | Rejection::WrongTier { .. }
            | Rejection::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The verdicts, when limits were asked.
    pub fn verdicts(&self) -> Option<&Verdicts> {
        match self {
            Rejection::Refused(verdicts)
            | Rejection::Unavailable(verdicts)
            | Rejection::TooLarge(verdicts) => Some(verdicts),
            Rejection::MissingKey { .. }
            | Rejection::NoClientAddress { .. }
            | Rejection::WrongTier { .. }
            | Rejection::Failed(_) => None,
        }
    }

    /// The rejection for `verdicts` that refuse.
    pub(super) fn of(verdicts: Verdicts) -> Self {
        if verdicts.iter().any(Verdict::exceeds_max) {
            Rejection::TooLarge(verdicts)
        } else if verdicts
            .iter()
            .any(|verdict| verdict.is_refused() && verdict.count().is_some())
        {
            Rejection::Refused(verdicts)
        } else {
            Rejection::Unavailable(verdicts)
        }
    }

    /// The event for a rejection that is the service's fault.
    pub(super) fn report(&self) {
        match self {
            Rejection::Failed(error) => failed(error),
            Rejection::NoClientAddress { limit } => misconfigured(limit, no_client_address!()),
            Rejection::WrongTier { limit } => misconfigured(limit, WRONG_TIER),
            Rejection::Refused(_)
            | Rejection::Unavailable(_)
            | Rejection::TooLarge(_)
            | Rejection::MissingKey { .. } => {}
        }
    }

    /// What `respond` answers, reported first, with the fields the answer lacks added.
    pub(super) fn answer<B>(self, respond: &impl OnRejection<B>, fields: Fields) -> Response<B> {
        self.report();
        let mut response = respond.on_rejection(self);
        fields.add_to(response.headers_mut());
        response
    }
}

/// Why a tier is answered 500 ([`Rejection::WrongTier`]).
const WRONG_TIER: &str = "a request's tier must be the rule's limit under another max \
     (Limit::with_max), the same in every other setting";

/// The error event for a rule the service set up wrong (feature `tracing`): its limit and the
/// fix, never the key.
fn misconfigured(limit: &str, fix: &str) {
    #[cfg(feature = "tracing")]
    tracing::error!(
        limit,
        "platformkit-limit: request answered 500 by the limit layer: {fix}"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = (limit, fix);
}

/// The error event for a hard error (feature `tracing`), with its sources.
fn failed(cause: &Error) {
    #[cfg(feature = "tracing")]
    tracing::error!(
        cause = cause as &dyn std::error::Error,
        "platformkit-limit: request answered 500 by the limit layer"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = cause;
}

/// The warning for a successful attempt that could not be taken back (feature `tracing`).
fn take_back_failed(cause: &Error) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        cause = cause as &dyn std::error::Error,
        "platformkit-limit: a successful attempt could not be taken back and stays counted"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = cause;
}

/// The rejection for refusing verdicts, such as
/// [`Reservations::Refused`]'s.
impl From<Verdicts> for Rejection {
    fn from(verdicts: Verdicts) -> Self {
        Rejection::of(verdicts)
    }
}

/// The rejection for a refusing verdict, such as
/// [`Reservation::Refused`](platformkit_limit::Reservation::Refused)'s.
impl From<Verdict> for Rejection {
    fn from(verdict: Verdict) -> Self {
        Rejection::of(Verdicts::from(vec![verdict]))
    }
}

/// A hard error: [`Rejection::Failed`].
impl From<Error> for Rejection {
    fn from(error: Error) -> Self {
        Rejection::Failed(error)
    }
}

/// The layer's own answer ([`DefaultOnRejection`]), `Retry-After` on a refusal, the event.
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum::response::IntoResponse for Rejection {
    fn into_response(self) -> axum::response::Response {
        let fields = Fields {
            retry_after: self.verdicts().and_then(Verdicts::retry_after_secs),
            ..Fields::default()
        };
        self.answer(&DefaultOnRejection, fields)
    }
}

/// Makes the response to a [`Rejection`]: implemented for `Fn(Rejection) -> http::Response<B>`
/// closures ([`LimitLayer::on_rejection`](super::LimitLayer::on_rejection)) and for
/// [`DefaultOnRejection`].
pub trait OnRejection<B>: Send + Sync + 'static {
    /// The response to `rejection`.
    fn on_rejection(&self, rejection: Rejection) -> Response<B>;
}

impl<B, F> OnRejection<B> for F
where
    F: Fn(Rejection) -> Response<B> + Send + Sync + 'static,
{
    fn on_rejection(&self, rejection: Rejection) -> Response<B> {
        self(rejection)
    }
}

/// The layer's own answers: the [`Rejection`]'s status and a one-line `text/plain` body that
/// names neither the limit nor the key. For any body that can be made from a `&'static str`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultOnRejection;

impl<B: From<&'static str>> OnRejection<B> for DefaultOnRejection {
    fn on_rejection(&self, rejection: Rejection) -> Response<B> {
        let body = match rejection {
            Rejection::Refused(_) => "too many requests\n",
            Rejection::Unavailable(_) => "service unavailable\n",
            Rejection::TooLarge(_) => {
                "content too large: the request costs more than a rate limit ever allows\n"
            }
            Rejection::MissingKey { .. } => {
                "bad request: the request lacks the key a rate limit counts it by\n"
            }
            Rejection::NoClientAddress { .. } => {
                concat!("internal server error: ", no_client_address!(), "\n")
            }
            Rejection::WrongTier { .. } | Rejection::Failed(_) => "internal server error\n",
        };
        let mut response = Response::new(B::from(body));
        *response.status_mut() = rejection.status();
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

/// The answers a gRPC client understands ([`LimitLayer::grpc`](super::LimitLayer::grpc)): HTTP
/// 200, an empty body, the status in `grpc-status` and `grpc-message` (trailers-only), the
/// fields as metadata. Which status for which rejection:
/// [behind a tower layer](crate#behind-a-tower-layer).
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcOnRejection;

impl<B: Default> OnRejection<B> for GrpcOnRejection {
    fn on_rejection(&self, rejection: Rejection) -> Response<B> {
        let (code, message) = match rejection {
            Rejection::Refused(_) => ("8", "too many requests"),
            Rejection::TooLarge(_) => ("9", "the request costs more than a rate limit ever allows"),
            Rejection::Unavailable(_) => ("14", "service unavailable"),
            Rejection::MissingKey { .. } => {
                ("3", "the request lacks the key a rate limit counts it by")
            }
            Rejection::NoClientAddress { .. }
            | Rejection::WrongTier { .. }
            | Rejection::Failed(_) => ("13", "internal error"),
        };
        let mut response = Response::new(B::default());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(GRPC_STATUS, HeaderValue::from_static(code));
        headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
        response
    }
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The header fields the layer adds to a response.
#[derive(Debug, Default)]
pub(super) struct Fields {
    /// `Retry-After`, in whole seconds: on a refusal.
    pub(super) retry_after: Option<u64>,
    /// The items of `RateLimit-Policy`, one per advertised limit.
    pub(super) policy: Vec<String>,
    /// The items of `RateLimit`, one per advertised limit that counted.
    pub(super) rate_limit: Vec<String>,
}

impl Fields {
    /// Adds each field the response does not have yet: one the service or handler set is theirs.
    pub(super) fn add_to(self, headers: &mut HeaderMap) {
        if let Some(secs) = self.retry_after {
            headers
                .entry(RETRY_AFTER)
                .or_insert_with(|| HeaderValue::from(secs));
        }
        for (name, items) in [
            (RATELIMIT_POLICY, self.policy),
            (RATELIMIT, self.rate_limit),
        ] {
            if items.is_empty() {
                continue;
            }
            // Names are ASCII letters, digits, '_', '-', '.' and the
            // parameters digits: always a valid field value.
            if let Ok(value) = HeaderValue::try_from(items.join(", ")) {
                headers.entry(name).or_insert(value);
            }
        }
    }
}
