//! What the layer answers instead of the service: [`Rejection`], and the fields it adds.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::{Error, Verdict, Verdicts};

/// Why the layer answered instead of the service (given to `LimitLayer::on_rejection`). With
/// the `axum` feature also an `IntoResponse`, for a handler's `?` (`examples/axum_form_login.rs`).
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// A limit refused by its count ([`Verdicts::refused_by`]): 429 Too Many Requests.
    Refused(Verdicts),
    /// No refusing limit counted (unreachable and [`Refuse`](crate::WhenUnreachable::Refuse),
    /// or [shed](crate::Verdicts::is_shed)): 503 Service Unavailable.
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
            Rejection::NoClientAddress { .. } | Rejection::Failed(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
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
            Rejection::Failed(error) => crate::trace::layer_failed(error),
            Rejection::NoClientAddress { limit } => {
                crate::trace::no_client_address(limit, no_client_address!());
            }
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

/// The rejection for refusing verdicts, such as
/// [`Reservations::Refused`](crate::Reservations::Refused)'s.
impl From<Verdicts> for Rejection {
    fn from(verdicts: Verdicts) -> Self {
        Rejection::of(verdicts)
    }
}

/// The rejection for a refusing verdict, such as
/// [`Reservation::Refused`](crate::Reservation::Refused)'s.
impl From<Verdict> for Rejection {
    fn from(verdict: Verdict) -> Self {
        Rejection::of(Verdicts::from_vec(vec![verdict]))
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

/// The answers a gRPC client understands ([`LimitLayer::grpc`](super::LimitLayer::grpc)): HTTP
/// 200, an empty body, the status in `grpc-status` and `grpc-message` (trailers-only), the
/// fields as metadata. Which status for which rejection:
/// [behind a tower layer](crate::guide#behind-a-tower-layer).
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
            Rejection::NoClientAddress { .. } | Rejection::Failed(_) => ("13", "internal error"),
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
