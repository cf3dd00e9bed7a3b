//! One request's path through the layer: what a [`LimitLayer`](super::LimitLayer) and its
//! services share ([`Config`]), each request's keys and cost, and [`LimitService`].

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::request::Parts;
use http::{Request, Response};
use tower::Service;

use super::client_ip::client_ip;
use super::response::{DefaultOnRejection, Fields, OnRejection, Rejection};
use crate::error::InvalidLimitSnafu;
use crate::store::Store;
use crate::{Error, Key, Limit, Limiter, Reservations, Verdicts};

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
                    crate::trace::take_back_failed(&e);
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
            Verdicts::from_vec(all)
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
                Some(tier) => {
                    let error = InvalidLimitSnafu {
                        name: tier.name(),
                        reason: format!(
                            "the tier of a request must be the rule's limit {:?} under another \
                             max (Limit::with_max), the same in every other setting",
                            rule.limit.name()
                        ),
                    }
                    .build();
                    return Err(Rejection::Failed(Error::from(error)));
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
