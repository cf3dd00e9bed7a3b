//! The admin router: its routes, their handlers, and the header fields of
//! every answer.

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Form, OriginalUri, Path, Query, State};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use http::{HeaderMap, HeaderValue, StatusCode, Uri};

use platformkit_limit::Store;
use platformkit_limit::{Error, Key, Limit, Limiter};

use super::csrf::Guard;
use super::render::{self, LimitPage, Lookup, Notice};

/// What the handlers share: the limiter, the limits it serves, the guard.
pub(super) struct Admin<S> {
    pub(super) limiter: Arc<Limiter<S>>,
    pub(super) limits: Vec<Limit>,
    pub(super) guard: Guard,
}

impl<S> Admin<S> {
    /// The configured limit named `name`: a page is only ever for one.
    fn limit(&self, name: &str) -> Option<&Limit> {
        self.limits.iter().find(|limit| limit.name() == name)
    }

    /// The limit a page's path names, or the name asked for (empty when
    /// the path cannot be read) when there is none.
    fn named(&self, name: Result<Path<String>, PathRejection>) -> Result<&Limit, String> {
        let Ok(Path(name)) = name else {
            return Err(String::new());
        };
        self.limit(&name).ok_or(name)
    }
}

/// The `Content-Security-Policy` of every answer: no script, no frame, no
/// other origin; forms only to this one.
const POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                      frame-ancestors 'none'; base-uri 'none'";

/// The router over `admin`.
pub(super) fn router<S: Store>(admin: Admin<S>) -> Router {
    Router::new()
        .route("/", get(index::<S>))
        .route("/{limit}", get(limit_page::<S>).post(look_up::<S>))
        .route("/{limit}/unlock", post(unlock::<S>))
        .fallback(not_found)
        .layer(middleware::map_response(secured))
        .with_state(Arc::new(admin))
}

/// Every answer's header fields, the router's own and axum's (a 405).
async fn secured(mut response: Response) -> Response {
    let fields = response.headers_mut();
    fields.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    fields.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    fields.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it, a browser sends a form's POST with
    // `Origin: null` (the Fetch standard's "append a request Origin
    // header"), which the guard refuses, as it must (a sandboxed frame
    // sends it too). `same-origin` keeps the page's address from any
    // other site, and the Origin as it is.
    fields.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    fields.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    response
}

/// The path the router is nested under: the original path less the part
/// this router routed on (`/support/limits` for `/support/limits/login`).
fn base(original: &Uri, inner: &Uri) -> String {
    let (whole, own) = (original.path(), inner.path());
    let base = if own == "/" {
        whole.trim_end_matches('/')
    } else {
        whole.strip_suffix(own).unwrap_or("")
    };
    base.to_owned()
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

fn error(status: StatusCode, base: &str, title: &str, message: &str) -> Response {
    html(status, render::error_page(base, title, message))
}

/// A failure of the store, as a page: 503 when it is unreachable or
/// overloaded (try again), 500 for anything else (a misconfiguration).
fn store_failed(base: &str, what: &str, e: &Error) -> Response {
    let status = if e.is_unreachable() || e.is_overloaded() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    error(
        status,
        base,
        "The limiter's store did not answer",
        &format!("{what}: {e}."),
    )
}

/// A 400 page: the request cannot be read.
fn bad_request(base: &str, message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, base, "Bad request", message)
}

fn no_such_limit(base: &str, name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        base,
        "No such limit",
        &format!("This page knows no limit named {name:?}."),
    )
}

/// The first value of the field `name`.
fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, value)| value.as_str())
}

async fn index<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
) -> Response {
    let base = base(&original, &uri);
    html(StatusCode::OK, render::index(&base, &admin.limits))
}

async fn not_found(OriginalUri(original): OriginalUri, uri: Uri) -> Response {
    let base = base(&original, &uri);
    error(
        StatusCode::NOT_FOUND,
        &base,
        "Not found",
        "No page here: the limits are listed on the first page.",
    )
}

/// `GET /{limit}`: the page, with the notice its query asks for; no key
/// is looked up from an address.
async fn limit_page<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
    name: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let base = base(&original, &uri);
    let limit = match admin.named(name) {
        Ok(limit) => limit,
        Err(name) => return no_such_limit(&base, &name),
    };
    let Ok(Query(query)) = query else {
        return bad_request(&base, "The address's query cannot be read.");
    };
    let notice = field(&query, "unlocked").map(|_| Notice::Unlocked);
    page(&admin, &base, limit, None, notice).await
}

/// `POST /{limit}`: the page, with the status of the key of the form
/// (`key`), which stays out of the page's address.
async fn look_up<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
    name: Result<Path<String>, PathRejection>,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Response {
    let base = base(&original, &uri);
    let limit = match admin.named(name) {
        Ok(limit) => limit,
        Err(name) => return no_such_limit(&base, &name),
    };
    let Ok(Form(fields)) = form else {
        return bad_request(&base, "A lookup is a form with a key.");
    };
    let typed = field(&fields, "key").filter(|typed| !typed.trim().is_empty());
    page(&admin, &base, limit, typed, None).await
}

/// A limit's page under `base`: the key `typed` looked up, if any, and the
/// keys the limit refuses now.
async fn page<S: Store>(
    admin: &Admin<S>,
    base: &str,
    limit: &Limit,
    typed: Option<&str>,
    notice: Option<Notice>,
) -> Response {
    let mut status = StatusCode::OK;
    let lookup = match typed {
        None => None,
        Some(typed) => match typed.parse::<Key>() {
            Ok(key) => match admin.limiter.status(limit, &key).await {
                Ok(found) => Some(Lookup::Found {
                    typed: typed.to_owned(),
                    status: found,
                }),
                Err(e) => return store_failed(base, "The key's status could not be read", &e),
            },
            Err(e) => {
                status = StatusCode::BAD_REQUEST;
                // The library's message says what to type; the page says
                // "Not a key" for its "invalid key".
                let reason = e.to_string();
                let reason = reason.strip_prefix("invalid key: ").unwrap_or(&reason);
                Some(Lookup::Invalid {
                    typed: typed.to_owned(),
                    reason: reason.to_owned(),
                })
            }
        },
    };
    let at_most = super::Admin::<S>::LISTED_KEYS;
    let refused = match admin.limiter.refused_keys(limit, at_most).await {
        Ok(refused) => refused,
        Err(e) => return store_failed(base, "The refused keys could not be read", &e),
    };
    let view = LimitPage {
        base,
        limit,
        guard: &admin.guard,
        more: refused.len() >= at_most,
        refused: &refused,
        lookup,
        notice,
    };
    html(status, render::limit_page(&view))
}

async fn unlock<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
    headers: HeaderMap,
    name: Result<Path<String>, PathRejection>,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Response {
    let base = base(&original, &uri);
    let limit = match admin.named(name) {
        Ok(limit) => limit,
        Err(name) => return no_such_limit(&base, &name),
    };
    let Ok(Form(fields)) = form else {
        return bad_request(
            &base,
            "An unlock is a form with a key and a token. Nothing was unlocked.",
        );
    };
    let stored = field(&fields, "key").unwrap_or("");
    if let Err(refusal) = admin.guard.check(
        &headers,
        &original,
        limit.name(),
        stored,
        field(&fields, "token"),
    ) {
        return error(
            StatusCode::FORBIDDEN,
            &base,
            "Forbidden: not unlocked",
            &refusal.explain(),
        );
    }
    // The token was this router's for this key: a key it listed or looked
    // up. Rebuilt from its encoding, so a digested key resets as stored.
    let Some(key) = Key::from_encoded(stored) else {
        return bad_request(
            &base,
            "The form's key is not a stored key. Nothing was unlocked.",
        );
    };
    if let Err(e) = admin.limiter.reset(limit, &key).await {
        return store_failed(
            &base,
            "The key may not be unlocked; reload the limit's page to see",
            &e,
        );
    }
    let back = format!("{}?unlocked", render::limit_href(&base, limit.name()));
    match HeaderValue::try_from(back) {
        Ok(location) => (StatusCode::SEE_OTHER, [(LOCATION, location)]).into_response(),
        Err(_) => html(
            StatusCode::OK,
            render::error_page(&base, "Unlocked", "The key's count is cleared."),
        ),
    }
}
