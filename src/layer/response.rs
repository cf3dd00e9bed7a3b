//! What the layer answers instead of the service: [`Rejection`], and the
//! header fields it adds.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::{Error, Verdict, Verdicts};

/// Why the layer answered instead of the service; what
/// [`LimitLayer::on_rejection`](super::LimitLayer::on_rejection) is given.
///
/// With the `axum` feature a `Rejection` is also an axum `IntoResponse`,
/// the layer's own answer ([`DefaultOnRejection`], with `Retry-After`), so
/// a handler that limits by what only the body holds answers as the layer
/// does. A login whose account is in the form, counted per account
/// ([`Limiter::reserve`](crate::Limiter::reserve)): wrong passwords count,
/// a good one is taken back, a refusal is the layer's 429 and a hard
/// error its 500 (both through `?` and `into`), a form without an account
/// is a 400.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use axum::extract::{Form, State};
/// use axum::http::StatusCode;
/// use axum::routing::post;
/// use axum::{Router, body::Body, http::Request};
/// use platformkit_limit::layer::Rejection;
/// use platformkit_limit::{Key, Limit, Limiter, Memory, Reservation};
/// use serde::Deserialize;
/// use tower::ServiceExt as _;
///
/// struct App {
///     limiter: Limiter<Memory>, // Limiter<Postgres<_>> in production
///     login: Limit,
/// }
///
/// #[derive(Deserialize)]
/// struct LoginForm {
///     #[serde(default)]
///     email: String,
///     password: String,
/// }
///
/// async fn login(
///     State(app): State<Arc<App>>,
///     Form(form): Form<LoginForm>,
/// ) -> Result<(StatusCode, &'static str), Rejection> {
///     if form.email.trim().is_empty() {
///         return Ok((StatusCode::BAD_REQUEST, "name the account\n"));
///     }
///     let permit = match app.limiter.reserve(&app.login, &Key::email(&form.email)).await? {
///         Reservation::Granted(permit) => permit,
///         Reservation::Refused(verdict) => return Err(verdict.into()),
///     };
///     if form.password != "correct horse" { // your password check
///         permit.failed();
///         return Ok((StatusCode::UNAUTHORIZED, "wrong email or password\n"));
///     }
///     // A take-back that fails leaves the attempt counted: the safe side.
///     let _ = permit.succeeded().await;
///     Ok((StatusCode::OK, "welcome\n"))
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let login_limit = Limit::new("login", 2, Duration::from_secs(900))?;
/// let app = Arc::new(App { limiter: Limiter::new(Memory::new()), login: login_limit });
/// let app = Router::new().route("/login", post(login)).with_state(app);
/// let post_form = |form: &'static str| {
///     Request::post("/login")
///         .header("content-type", "application/x-www-form-urlencoded")
///         .body(Body::from(form))
/// };
/// let status = async |form| Ok::<_, Box<dyn std::error::Error>>(
///     app.clone().oneshot(post_form(form)?).await?.status(),
/// );
/// assert_eq!(status("email=alice%40example.com&password=correct+horse").await?, 200);
/// for _ in 0..2 {
///     assert_eq!(status("email=alice%40example.com&password=guess").await?, 401);
/// }
/// assert_eq!(status("email=ALICE%40example.com&password=correct+horse").await?, 429);
/// assert_eq!(status("password=guess").await?, 400);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// A limit refused by its count: 429 Too Many Requests.
    /// [`Verdicts::refused_by`] names it and
    /// [`Verdicts::retry_after_secs`] says when to come back.
    Refused(Verdicts),
    /// No refusing limit counted: the store is unreachable and a limit has
    /// [`WhenUnreachable::Refuse`](crate::WhenUnreachable::Refuse), or the
    /// store is overloaded and the call was shed
    /// ([`Verdicts::is_shed`](crate::Verdicts::is_shed); `Retry-After` is
    /// then [`Verdict::SHED_RETRY_AFTER`](crate::Verdict::SHED_RETRY_AFTER)):
    /// 503 Service Unavailable.
    Unavailable(Verdicts),
    /// The ask's cost is above a limit's max
    /// ([`Verdict::exceeds_max`]; the request's
    /// [cost](super::LimitLayer::cost), or a
    /// [`Limiter::hit_n`](crate::Limiter::hit_n) in a handler): no window
    /// ever allows it, so there is no `Retry-After`. 413 Content Too Large,
    /// and nothing counted. [`Verdicts::refused_by`] names the limit.
    TooLarge(Verdicts),
    /// A rule added with [`LimitLayer::require`](super::LimitLayer::require)
    /// found no key in the request (a login without its account): 400 Bad
    /// Request, and nothing counted. The client's mistake, so no event.
    MissingKey {
        /// The name of the rule's limit.
        limit: String,
    },
    /// A rule added with
    /// [`LimitLayer::limit_per_client_ip`](super::LimitLayer::limit_per_client_ip)
    /// found no client address: the service is served without axum's
    /// `ConnectInfo` and sets no [`ClientIp`](super::ClientIp). 500
    /// Internal Server Error, never a silent allow, and an error event
    /// (feature `tracing`) naming the limit; the default body says how to
    /// fix it.
    NoClientAddress {
        /// The name of the rule's limit.
        limit: String,
    },
    /// A hard error (a misconfiguration such as a missing table or
    /// privilege): 500 Internal Server Error, never a silent allow, and an
    /// error event (feature `tracing`).
    Failed(Error),
}

/// How to hand a per-address rule the client's address: the default
/// answer's body and the error event both say it.
macro_rules! no_client_address {
    () => {
        "a per-address limit found no client address: serve with \
         into_make_service_with_connect_info::<SocketAddr>(), or set a ClientIp from a \
         trusted proxy before the layer"
    };
}

impl Rejection {
    /// The status the default answer has: 429, 503, 413, 400 or 500.
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

    /// The refusal for `verdicts` that refuse: by a cost above a limit's
    /// max (waiting would not help), by a count, or, when no refusing limit
    /// counted, because the store is unreachable or overloaded (shed).
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

    /// What `respond` answers, reported first, with the fields the answer
    /// lacks added.
    pub(super) fn answer<B>(self, respond: &impl OnRejection<B>, fields: Fields) -> Response<B> {
        self.report();
        let mut response = respond.on_rejection(self);
        fields.add_to(response.headers_mut());
        response
    }
}

/// The rejection for verdicts that refuse, such as a
/// [`Reservations::Refused`](crate::Reservations::Refused)'s: 413 for a
/// cost above a limit's max, 429 when a refusing limit counted, else 503.
impl From<Verdicts> for Rejection {
    fn from(verdicts: Verdicts) -> Self {
        Rejection::of(verdicts)
    }
}

/// The rejection for a verdict that refuses, such as a
/// [`Reservation::Refused`](crate::Reservation::Refused)'s: 413 for a
/// cost above its limit's max, 429 when it counted, else 503.
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

/// The layer's own answer ([`DefaultOnRejection`]) with `Retry-After` on a
/// refusal, the event of [`Rejection::Failed`] and
/// [`Rejection::NoClientAddress`] included: for a handler that limits by
/// what the head does not hold (the example on [`Rejection`]).
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

/// Makes the response to a [`Rejection`]: implemented for
/// `Fn(Rejection) -> http::Response<B>` closures (see
/// [`LimitLayer::on_rejection`](super::LimitLayer::on_rejection)) and for
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
/// ("too many requests", "service unavailable", "content too large: ...",
/// "bad request: ...", "internal server error"); for [`Rejection::NoClientAddress`], the body
/// says how to hand the layer the address.
/// For any body type that can be made from a `&'static str` (axum's
/// `Body`, `String`, `http_body_util::Full<Bytes>`).
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
