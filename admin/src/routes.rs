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
use platformkit_limit::{Error, Key, KeyStatus, Limit, Limiter};

use super::csrf::{EVERY_LIMIT, Guard, Refusal};
use super::render::{self, IndexPage, LimitPage, Lookup, Notice};

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

impl<S: Store> Admin<S> {
    /// `key`'s status under each limit, in their order: reads, nothing
    /// counted.
    async fn statuses(&self, key: &Key) -> Result<Vec<KeyStatus>, Error> {
        let mut statuses = Vec::with_capacity(self.limits.len());
        for limit in &self.limits {
            statuses.push(self.limiter.status(limit, key).await?);
        }
        Ok(statuses)
    }
}

/// The `Content-Security-Policy` of every answer: no script, no frame, no
/// other origin; forms only to this one.
const POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                      frame-ancestors 'none'; base-uri 'none'";

/// The router over `admin`.
pub(super) fn router<S: Store>(admin: Admin<S>) -> Router {
    Router::new()
        .route("/", get(index::<S>).post(look_up_everywhere::<S>))
        .route("/{limit}", get(limit_page::<S>).post(look_up::<S>))
        .route("/{limit}/unlock", post(unlock::<S>))
        .route("/~all/unlock", post(unlock_everywhere::<S>))
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

/// A 403 page: an unlock refused by the guard, which says why.
fn forbidden(base: &str, refusal: &Refusal) -> Response {
    error(
        StatusCode::FORBIDDEN,
        base,
        "Forbidden: not unlocked",
        &refusal.explain(),
    )
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
    let view = IndexPage {
        base: &base,
        limits: &admin.limits,
        guard: &admin.guard,
        lookup: None,
        cleared: None,
    };
    html(StatusCode::OK, render::index(&view))
}

/// `POST /`: the index, with the status of the key of the form (`key`)
/// under every limit.
async fn look_up_everywhere<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Response {
    let base = base(&original, &uri);
    let Ok(Form(fields)) = form else {
        return bad_request(&base, "A lookup is a form with a key.");
    };
    let typed = field(&fields, "key").filter(|typed| !typed.trim().is_empty());
    let lookup = match typed.map(|typed| (typed, parse_key(typed))) {
        None => None,
        Some((typed, Ok(key))) => match admin.statuses(&key).await {
            Ok(statuses) => Some(Lookup::Found {
                typed: typed.to_owned(),
                status: statuses,
            }),
            Err(e) => return store_failed(&base, "The key's status could not be read", &e),
        },
        Some((typed, Err(reason))) => Some(Lookup::Invalid {
            typed: typed.to_owned(),
            reason,
        }),
    };
    let status = match lookup {
        Some(Lookup::Invalid { .. }) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    };
    let view = IndexPage {
        base: &base,
        limits: &admin.limits,
        guard: &admin.guard,
        lookup,
        cleared: None,
    };
    html(status, render::index(&view))
}

/// The key `typed` names, or why it names none: the library's message,
/// which says what to type (the page says "Not a key" for its "invalid
/// key").
fn parse_key(typed: &str) -> Result<Key, String> {
    typed.parse::<Key>().map_err(|e| {
        let reason = e.to_string();
        reason
            .strip_prefix("invalid key: ")
            .unwrap_or(&reason)
            .to_owned()
    })
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
        Some(typed) => match parse_key(typed) {
            Ok(key) => match admin.limiter.status(limit, &key).await {
                Ok(found) => Some(Lookup::Found {
                    typed: typed.to_owned(),
                    status: found,
                }),
                Err(e) => return store_failed(base, "The key's status could not be read", &e),
            },
            Err(reason) => {
                status = StatusCode::BAD_REQUEST;
                Some(Lookup::Invalid {
                    typed: typed.to_owned(),
                    reason,
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
        return forbidden(&base, &refusal);
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

/// `POST /~all/unlock`: resets the key of the form (`key`, `token`) under
/// each limit, then the index, which says what went and shows the key
/// under every limit again.
async fn unlock_everywhere<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
    headers: HeaderMap,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Response {
    let base = base(&original, &uri);
    let Ok(Form(fields)) = form else {
        return bad_request(
            &base,
            "An unlock is a form with a key and a token. Nothing was unlocked.",
        );
    };
    let stored = field(&fields, "key").unwrap_or("");
    let token = field(&fields, "token");
    if let Err(refusal) = admin
        .guard
        .check(&headers, &original, EVERY_LIMIT, stored, token)
    {
        return forbidden(&base, &refusal);
    }
    let Some(key) = Key::from_encoded(stored) else {
        return bad_request(
            &base,
            "The form's key is not a stored key. Nothing was unlocked.",
        );
    };
    let mut cleared = Vec::new();
    for limit in &admin.limits {
        match admin.limiter.reset(limit, &key).await {
            Ok(0) => {}
            Ok(windows) => cleared.push((limit.name(), windows)),
            Err(e) => {
                let what = format!(
                    "The key may not be unlocked under {} and the limits after it; \
                     look it up again to see",
                    limit.name()
                );
                return store_failed(&base, &what, &e);
            }
        }
    }
    let statuses = match admin.statuses(&key).await {
        Ok(statuses) => statuses,
        Err(e) => return store_failed(&base, "Unlocked; the key's status could not be read", &e),
    };
    let view = IndexPage {
        base: &base,
        limits: &admin.limits,
        guard: &admin.guard,
        lookup: Some(Lookup::Found {
            typed: key.spelling(),
            status: statuses,
        }),
        cleared: Some(cleared),
    };
    html(StatusCode::OK, render::index(&view))
}
