//! [`LimitService`]: one request's path through the layer.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response};
use tower::Service;

use super::config::Asked;
use super::response::{DefaultOnRejection, Fields, OnRejection, Rejection};
use super::{Config, Mode};
use crate::store::Store;
use crate::{Key, Limit, Reservations, Verdicts};

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
