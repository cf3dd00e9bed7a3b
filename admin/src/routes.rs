//! The admin router: its routes, their handlers, and the header fields of
//! every answer.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Form, FromRequest, OriginalUri, Path, Query, Request, State};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode, Uri};

use platformkit_limit::Store;
use platformkit_limit::{AuditEntry, Error, ErrorKind, Key, KeyStatus, Limit, Limiter};

use super::Staff;
use super::csrf::{Action, EVERY_LIMIT, Guard, Refusal};
use super::render::{self, IndexPage, LimitPage, Lookup, Notice};

/// What the handlers share: the limiter, the limits it serves, the guard,
/// and who the staff member of a request is.
pub(super) struct Admin<S> {
    pub(super) limiter: Arc<Limiter<S>>,
    pub(super) limits: Vec<Limit>,
    pub(super) guard: Guard,
    pub(super) staff: Option<Staff>,
}

/// How many of the newest audit entries a lookup reads to find the key's:
/// its entries among them are shown.
const AUDIT_SCAN: usize = Limiter::MAX_REFUSED_KEYS;

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

    /// Who the request is from, as the audit names them: the staff member
    /// [`Admin::staff`](super::Admin::staff) reads, to the audit's bound,
    /// else [`UNNAMED_STAFF`](super::Admin::UNNAMED_STAFF).
    fn by(&self, request: &Parts) -> String {
        let named = self.staff.as_ref().and_then(|staff| staff(request));
        match named.as_deref().map(str::trim) {
            Some(name) if !name.is_empty() => {
                let most = Limiter::MAX_AUDIT_BYTES.0;
                let mut end = name.len().min(most);
                while !name.is_char_boundary(end) {
                    end -= 1;
                }
                name[..end].to_owned()
            }
            _ => super::UNNAMED_STAFF.to_owned(),
        }
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

    /// The audit entries of the key stored as `stored` (encoded), among the
    /// newest [`AUDIT_SCAN`] of `limit` or of every limit of the router,
    /// at most [`AUDIT_ENTRIES`](super::Admin::AUDIT_ENTRIES).
    async fn key_audit(
        &self,
        limit: Option<&Limit>,
        stored: &str,
    ) -> Result<Vec<AuditEntry>, Error> {
        let entries = self.limiter.audit(limit, AUDIT_SCAN).await?;
        Ok(entries
            .into_iter()
            .filter(|entry| entry.key() == stored && self.limit(entry.limit()).is_some())
            .take(super::Admin::<S>::AUDIT_ENTRIES)
            .collect())
    }
}

/// A POST of a form that acts on a key: the path the router is nested
/// under, the request's URI as sent and its header fields (for the guard),
/// who sent it, and the form's fields (`None` when they cannot be read).
struct Posted {
    base: String,
    original: Uri,
    headers: HeaderMap,
    by: String,
    fields: Option<Vec<(String, String)>>,
}

impl<S: Store> FromRequest<Arc<Admin<S>>> for Posted {
    type Rejection = Infallible;

    async fn from_request(request: Request, admin: &Arc<Admin<S>>) -> Result<Self, Infallible> {
        let (parts, body) = request.into_parts();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map_or_else(|| parts.uri.clone(), |original| original.0.clone());
        let base = base(&original, &parts.uri);
        let by = admin.by(&parts);
        let headers = parts.headers.clone();
        let form =
            Form::<Vec<(String, String)>>::from_request(Request::from_parts(parts, body), &())
                .await;
        Ok(Posted {
            base,
            original,
            headers,
            by,
            fields: form.ok().map(|Form(fields)| fields),
        })
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
        .route("/{limit}/block", post(block::<S>))
        .route("/{limit}/unblock", post(unblock::<S>))
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

/// A 403 page: `action` refused by the guard, which says why.
fn forbidden(base: &str, action: Action, refusal: &Refusal) -> Response {
    error(
        StatusCode::FORBIDDEN,
        base,
        &format!("Forbidden: not {}", action.done()),
        &refusal.explain(action),
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
        key_audit: None,
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
    let (status, lookup) = match typed.map(|typed| (typed, parse_key(typed))) {
        None => (StatusCode::OK, None),
        Some((typed, Ok(key))) => return index_with(&admin, &base, typed, &key, None).await,
        Some((typed, Err(reason))) => (
            StatusCode::BAD_REQUEST,
            Some(Lookup::Invalid {
                typed: typed.to_owned(),
                reason,
            }),
        ),
    };
    let view = IndexPage {
        base: &base,
        limits: &admin.limits,
        guard: &admin.guard,
        lookup,
        key_audit: None,
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
    let notice = query.iter().find_map(|(name, value)| match name.as_str() {
        "unlocked" => Some(Notice::Unlocked),
        "blocked" => Some(Notice::Blocked),
        "unblocked" if value == "0" => Some(Notice::NotBlocked),
        "unblocked" => Some(Notice::Unblocked),
        _ => None,
    });
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

/// A limit's page under `base`: the key `typed` looked up, if any, with
/// its audit entries, the keys the limit refuses now, and the limit's
/// newest audit entries.
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
    let key_audit = match &lookup {
        Some(Lookup::Found { status, .. }) => {
            match admin.key_audit(Some(limit), status.key()).await {
                Ok(entries) => Some(entries),
                Err(e) => return store_failed(base, "The key's audit could not be read", &e),
            }
        }
        _ => None,
    };
    let audit = match admin
        .limiter
        .audit(Some(limit), super::Admin::<S>::AUDIT_ENTRIES)
        .await
    {
        Ok(audit) => audit,
        Err(e) => return store_failed(base, "The audit could not be read", &e),
    };
    let view = LimitPage {
        base,
        limit,
        guard: &admin.guard,
        more: refused.len() >= at_most,
        refused: &refused,
        lookup,
        key_audit: key_audit.as_deref(),
        audit: &audit,
        notice,
    };
    html(status, render::limit_page(&view))
}

/// The reason of an action's form, trimmed, or what the 400 page says of
/// it.
fn reason(action: Action, fields: &[(String, String)]) -> Result<&str, String> {
    let done = action.done();
    let reason = field(fields, "reason").map_or("", str::trim);
    let most = Limiter::MAX_AUDIT_BYTES.1;
    if reason.is_empty() {
        Err(format!(
            "Say why: a reason is required, and the audit keeps it. Nothing was {done}."
        ))
    } else if reason.len() > most {
        Err(format!(
            "The reason is too long: at most {most} bytes. Nothing was {done}."
        ))
    } else {
        Ok(reason)
    }
}

/// How long the block form's `for` says, in seconds: one of the choices
/// the page offers for `limit`.
fn block_for(limit: &Limit, fields: &[(String, String)]) -> Option<Duration> {
    let secs = field(fields, "for")?.parse::<u64>().ok()?;
    render::block_choices(limit)
        .any(|(offered, _)| offered == secs)
        .then(|| Duration::from_secs(secs))
}

/// `POST /{limit}/unlock`: [`act`] on the key of the form.
async fn unlock<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    name: Result<Path<String>, PathRejection>,
    posted: Posted,
) -> Response {
    act(&admin, Action::Unlock, name, posted).await
}

/// `POST /{limit}/block`: [`act`] on the key of the form.
async fn block<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    name: Result<Path<String>, PathRejection>,
    posted: Posted,
) -> Response {
    act(&admin, Action::Block, name, posted).await
}

/// `POST /{limit}/unblock`: [`act`] on the key of the form.
async fn unblock<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    name: Result<Path<String>, PathRejection>,
    posted: Posted,
) -> Response {
    act(&admin, Action::Unblock, name, posted).await
}

/// `action` on the key of the form (`key`, `token`, `reason`, and for a
/// block `for`, in seconds) under the limit the path names, audited with
/// who and why, then a 303 back to the limit's page. The guard first, then
/// the form: a refused or incomplete form changes nothing.
async fn act<S: Store>(
    admin: &Admin<S>,
    action: Action,
    name: Result<Path<String>, PathRejection>,
    posted: Posted,
) -> Response {
    let base = &posted.base;
    let done = action.done();
    let limit = match admin.named(name) {
        Ok(limit) => limit,
        Err(name) => return no_such_limit(base, &name),
    };
    let Some(fields) = &posted.fields else {
        return bad_request(
            base,
            &format!(
                "The form cannot be read: it has a key, a reason and a token. Nothing was {done}."
            ),
        );
    };
    let stored = field(fields, "key").unwrap_or("");
    let token = field(fields, "token");
    let checked = admin.guard.check(
        &posted.headers,
        &posted.original,
        action,
        limit.name(),
        stored,
        token,
    );
    if let Err(refusal) = checked {
        return forbidden(base, action, &refusal);
    }
    // The token was this router's for this key: a key it listed or looked
    // up. Rebuilt from its encoding, so a digested key acts as stored.
    let Some(key) = Key::from_encoded(stored) else {
        return bad_request(
            base,
            &format!("The form's key is not a stored key. Nothing was {done}."),
        );
    };
    let reason = match reason(action, fields) {
        Ok(reason) => reason,
        Err(said) => return bad_request(base, &said),
    };
    let (limiter, by) = (&admin.limiter, posted.by.as_str());
    let acted = match action {
        Action::Unlock => limiter.unlock(limit, &key, by, reason).await.map(|_| ""),
        Action::Unblock => limiter
            .unblock(limit, &key, by, reason)
            .await
            .map(|ended| if ended == 0 { "=0" } else { "" }),
        Action::Block => {
            let Some(block_for) = block_for(limit, fields) else {
                return bad_request(
                    base,
                    "Choose how long the block lasts from the page's list. Nothing was blocked.",
                );
            };
            limiter
                .block(limit, &key, block_for, by, reason)
                .await
                .map(|_| "")
        }
    };
    let none = match acted {
        Ok(none) => none,
        Err(e) if e.kind() == ErrorKind::InvalidOption => {
            return bad_request(base, &format!("{e}. Nothing was {done}."));
        }
        Err(e) => {
            let what = format!("The key may not be {done}; reload the limit's page to see");
            return store_failed(base, &what, &e);
        }
    };
    // `?unblocked=0`: the key had no block to end.
    let back = format!("{}?{done}{none}", render::limit_href(base, limit.name()));
    match HeaderValue::try_from(back) {
        Ok(location) => (StatusCode::SEE_OTHER, [(LOCATION, location)]).into_response(),
        Err(_) => html(
            StatusCode::OK,
            render::error_page(base, "Done", &format!("The key is {done}.")),
        ),
    }
}

/// `POST /~all/unlock`: unlocks the key of the form (`key`, `token`,
/// `reason`) under each limit, audited, then the index, which says what
/// went and shows the key under every limit again.
async fn unlock_everywhere<S: Store>(
    State(admin): State<Arc<Admin<S>>>,
    posted: Posted,
) -> Response {
    let base = &posted.base;
    let Some(fields) = &posted.fields else {
        return bad_request(
            base,
            "The form cannot be read: it has a key, a reason and a token. Nothing was unlocked.",
        );
    };
    let stored = field(fields, "key").unwrap_or("");
    let token = field(fields, "token");
    let checked = admin.guard.check(
        &posted.headers,
        &posted.original,
        Action::Unlock,
        EVERY_LIMIT,
        stored,
        token,
    );
    if let Err(refusal) = checked {
        return forbidden(base, Action::Unlock, &refusal);
    }
    let Some(key) = Key::from_encoded(stored) else {
        return bad_request(
            base,
            "The form's key is not a stored key. Nothing was unlocked.",
        );
    };
    let reason = match reason(Action::Unlock, fields) {
        Ok(reason) => reason,
        Err(said) => return bad_request(base, &said),
    };
    let mut cleared = Vec::new();
    for limit in &admin.limits {
        match admin.limiter.unlock(limit, &key, &posted.by, reason).await {
            Ok(0) => {}
            Ok(windows) => cleared.push((limit.name(), windows)),
            Err(e) => {
                let what = format!(
                    "The key may not be unlocked under {} and the limits after it; \
                     look it up again to see",
                    limit.name()
                );
                return store_failed(base, &what, &e);
            }
        }
    }
    index_with(&admin, base, &key.spelling(), &key, Some(cleared)).await
}

/// The index with `key` (looked up as `typed`) under every limit, its
/// audit entries, and what an unlock under every limit cleared, if one did.
async fn index_with<'a, S: Store>(
    admin: &'a Admin<S>,
    base: &str,
    typed: &str,
    key: &Key,
    cleared: Option<Vec<(&'a str, u64)>>,
) -> Response {
    let statuses = match admin.statuses(key).await {
        Ok(statuses) => statuses,
        Err(e) => {
            let what = if cleared.is_some() {
                "Unlocked; the key's status could not be read"
            } else {
                "The key's status could not be read"
            };
            return store_failed(base, what, &e);
        }
    };
    let audit = match admin.key_audit(None, key.as_str()).await {
        Ok(audit) => audit,
        Err(e) => return store_failed(base, "The key's audit could not be read", &e),
    };
    let view = IndexPage {
        base,
        limits: &admin.limits,
        guard: &admin.guard,
        lookup: Some(Lookup::Found {
            typed: typed.to_owned(),
            status: statuses,
        }),
        key_audit: Some(&audit),
        cleared,
    };
    html(StatusCode::OK, render::index(&view))
}
