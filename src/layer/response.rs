//! What the layer answers instead of the service: [`Rejection`], and the
//! header fields it adds.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::{Error, Verdicts};

/// Why the layer answered instead of the service; what
/// [`LimitLayer::on_rejection`](crate::LimitLayer::on_rejection) is given.
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// A limit refused by its count: 429 Too Many Requests.
    /// [`Verdicts::refused_by`] names it and
    /// [`Verdicts::retry_after_secs`] says when to come back.
    Refused(Verdicts),
    /// Refused with no count: the store could not be reached and a limit
    /// refuses then ([`WhenUnreachable::Refuse`](crate::WhenUnreachable::Refuse)):
    /// No refusing limit counted: the store is unreachable and a limit has
    /// [`WhenUnreachable::Refuse`](crate::WhenUnreachable::Refuse), or the
    /// store is overloaded and the call was shed
    /// ([`Verdicts::is_shed`](crate::Verdicts::is_shed); `Retry-After` is
    /// then [`Verdict::SHED_RETRY_AFTER`](crate::Verdict::SHED_RETRY_AFTER)):
    /// 503 Service Unavailable.
    Unavailable(Verdicts),
    /// A hard error (a misconfiguration such as a missing table or
    /// privilege, or no client address for a per-address rule): 500
    /// Internal Server Error, never a silent allow.
    Failed(Error),
}

impl Rejection {
    /// The status the default answer has: 429, 503 or 500.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Refused(_) => StatusCode::TOO_MANY_REQUESTS,
            Rejection::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The verdicts, unless the rejection is an error.
    pub fn verdicts(&self) -> Option<&Verdicts> {
        match self {
            Rejection::Refused(verdicts) | Rejection::Unavailable(verdicts) => Some(verdicts),
            Rejection::Failed(_) => None,
        }
    }

    /// The refusal for `verdicts` that refuse: by a count, or, when no
    /// refusing limit counted, because the store is unreachable or
    /// overloaded (shed).
    pub(super) fn of(verdicts: Verdicts) -> Self {
        if verdicts
            .iter()
            .any(|verdict| verdict.is_refused() && verdict.count().is_some())
        {
            Rejection::Refused(verdicts)
        } else {
            Rejection::Unavailable(verdicts)
        }
    }
}

/// Makes the response to a [`Rejection`]: implemented for
/// `Fn(Rejection) -> http::Response<B>` closures (see
/// [`LimitLayer::on_rejection`](crate::LimitLayer::on_rejection)) and for
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

/// The layer's own answers: the [`Rejection`]'s status with a one-line
/// `text/plain` body that says nothing about the limit or the key
/// ("too many requests", "service unavailable", "internal server error").
/// For any body type that can be made from a `&'static str` (axum's
/// `Body`, `String`, `http_body_util::Full<Bytes>`).
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultOnRejection;

impl<B: From<&'static str>> OnRejection<B> for DefaultOnRejection {
    fn on_rejection(&self, rejection: Rejection) -> Response<B> {
        let body = match rejection {
            Rejection::Refused(_) => "too many requests\n",
            Rejection::Unavailable(_) => "service unavailable\n",
            Rejection::Failed(_) => "internal server error\n",
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

/// The field `RateLimit-Policy`.
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The field `RateLimit`.
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
    /// Adds each field the response does not have yet: a field the service
    /// or the rejection handler set is theirs.
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
