//! An admin page for support staff, over
//! [platformkit-limit](platformkit_limit)'s public API: who each limit
//! refuses now, one key's status, an **Unlock** button that
//! [`unlock`](platformkit_limit::Limiter::unlock)s a key, **Block** and
//! **Unblock**, each audited with who and why. Plain server-rendered HTML, no
//! JavaScript, in an axum [`Router`](axum::Router) for the service to
//! mount.
//!
//! **It has no authentication or authorization of its own.** Mount it
//! behind the service's own (a staff login, a role check, an internal-only
//! listener): anyone who can reach it can read the refused keys (personal
//! data: email addresses, usernames, IP addresses) and unlock or block any
//! key of the limits it was given. It knows only those limits: a page and an
//! unlock are for a limit named by the router's configuration, never by
//! the request.
//!
//! What it does guard against is a cross-site request: a page elsewhere
//! that makes a signed-in staff member's browser post an unlock. Each
//! unlock, block and unblock must carry a token the page embeds, an
//! HMAC-SHA256 of the time the page was rendered, the action, the limit's
//! name and the key under the router's secret (random unless given with
//! [`Admin::secret`]), younger than [`Admin::UNLOCK_TOKEN_LIFETIME`];
//! `Sec-Fetch-Site`, when the browser sends it, must be `same-origin`, and
//! `Origin`, when sent, must be the page's own, scheme included
//! ([`Admin::origin`] says how the page knows it). Anything else is a 403
//! and changes nothing. Every value on a page is
//! escaped (keys are whatever an attacker typed), a key is shown in its
//! [`spelling`](platformkit_limit::Key::spelling), so that no two keys look
//! alike (what shows as nothing is written `\u{…}`), and every answer
//! carries `Cache-Control: no-store`, `X-Content-Type-Options: nosniff`,
//! `X-Frame-Options: DENY`, `Referrer-Policy: same-origin` and a
//! `Content-Security-Policy` that allows no script, no frame and forms only
//! to the page's own origin.
//!
//! The routes, under the path the router is mounted at:
//!
//! | route | what |
//! |---|---|
//! | `GET /` | the limits: name, max, window, lockout, and a box to look a key up under every limit (at the path, with or without a trailing slash) |
//! | `POST /` | the same, and the key of the form (`key`, typed as on a limit's page; a text that is no key is a 400) under every limit, in one table: each limit by name, the key's count of its max (`0 / max` where it has none), refused or allowed, when it reopens, its lockout; then its audit entries under those limits. Read, nothing counted |
//! | `GET /{limit}` | who the limit refuses now, newest first (at most [`Admin::LISTED_KEYS`]), with counts, window end, reopening and lockout, then the limit's last [`Admin::AUDIT_ENTRIES`] audit entries (when, who, what, key, until, why); a key in the query is not looked up |
//! | `POST /{limit}` | the same, and the status of the key the form names (`key`), its Block form, its Unblock form when it is blocked or locked out, and its audit entries: a POST, so that the key stays out of the address (access logs, history). Staff type a key as a row shows it (its [`spelling`](platformkit_limit::Key::spelling)), an email or IP address alone, or `user:…` (every form: [`Key`'s `FromStr`](platformkit_limit::Key#impl-FromStr-for-Key)); a text in none is a 400 that says what to type |
//! | `POST /{limit}/unlock` | [`unlock`](platformkit_limit::Limiter::unlock)s the key of the form (`key`, `token`, `reason`) by [`Admin::staff`], then a 303 back to the limit's page; an empty reason is a 400 |
//! | `POST /{limit}/block` | [`block`](platformkit_limit::Limiter::block)s the key of the form (`key`, `token`, `reason`, `for`: seconds, one of the page's choices, 15 minutes to 30 days) by [`Admin::staff`], then a 303 back; its token blocks only, and no unlock or unblock token blocks |
//! | `POST /{limit}/unblock` | [`unblock`](platformkit_limit::Limiter::unblock)s the key of the form (`key`, `token`, `reason`) by [`Admin::staff`], then a 303 back; its token unblocks only |
//! | `POST /~all/unlock` | unlocks the key of the form (`key`, `token`, `reason`) under every limit, then the index, which says how many windows went under which limit (or that there was nothing to reset) and shows the key under every limit again. Its token is bound to the key and to every limit: it unlocks no other key and under no single limit's route, nor does a limit's token unlock here |
//!
//! A store that cannot answer is a page that says so (503 when it is
//! unreachable or overloaded, 500 otherwise); an unknown limit, or any
//! other path, is a 404 page.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use axum::Router;
//! use platformkit_limit::{Limit, Limiter, Postgres};
//! use platformkit_limit_admin as admin;
//!
//! # async fn serve(config: tokio_postgres::Config) -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Arc::new(Limiter::new(Postgres::new(config)));
//! let login = Limit::new("login", 5, Duration::from_secs(15 * 60))?;
//! let reset_password = Limit::new("reset-password", 3, Duration::from_secs(60 * 60))?;
//!
//! let support = admin::router(limiter.clone(), [login.clone(), reset_password.clone()])?;
//! let app: Router = Router::new()
//!     // Behind the service's own staff authentication: the admin router
//!     // has none. `nest_service`, under which `/support/limits/` is the
//!     // index too (under `nest`, axum routes no path with the slash).
//!     .nest_service("/support/limits", support);
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! # axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! With several replicas behind a load balancer, give every replica the
//! same secret ([`Admin::secret`]): with a random one, a page rendered by
//! one replica can unlock only through that replica (a 403 elsewhere,
//! which says to reload the page). Give the page its origin
//! ([`Admin::origin`]) when it is served over HTTP/1.1, so that an
//! unlock's `Origin` is checked with its scheme.

mod csrf;
mod render;
mod routes;
mod time;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use platformkit_limit::Store;
use platformkit_limit::{Error, Limit, Limiter, ManualClock};

use self::csrf::{Guard, serialized_origin};

/// The admin router's configuration: the limiter, its limits, and the
/// secret of its tokens. [`router`] is `Admin::new(…).router()`.
///
/// ```
/// use platformkit_limit_admin::Admin;
/// use platformkit_limit::{ErrorKind, Limit, Limiter, Memory};
/// use std::time::Duration;
///
/// let limiter = Limiter::new(Memory::new());
/// let login = Limit::new("login", 5, Duration::from_secs(900))?;
/// let router = Admin::new(limiter, [login.clone()])
///     .secret(b"one secret for every replica, 32 bytes or more")
///     .router()?;
///
/// // Two limits of one name would be one page.
/// let twice = Admin::new(Limiter::new(Memory::new()), [login.clone(), login]).router();
/// assert_eq!(twice.unwrap_err().kind(), ErrorKind::InvalidOption);
/// # drop(router);
/// # Ok::<(), platformkit_limit::Error>(())
/// ```
pub struct Admin<S> {
    limiter: Arc<Limiter<S>>,
    limits: Vec<Limit>,
    secret: Option<Vec<u8>>,
    origin: Option<String>,
    clock: Option<ManualClock>,
    staff: Option<Staff>,
}

/// [`Admin::UNNAMED_STAFF`].
const UNNAMED_STAFF: &str = "admin page";

/// Who sent a request, as [`Admin::staff`] reads it.
pub(crate) type Staff = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

impl<S> fmt::Debug for Admin<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("limits", &self.limits)
            .field(
                "secret",
                &self.secret.as_ref().map(|_| "<given, not shown>"),
            )
            .field("origin", &self.origin)
            .field("clock", &self.clock)
            .field("staff", &self.staff.as_ref().map(|_| "<given>"))
            .finish_non_exhaustive()
    }
}

impl<S: Store> Admin<S> {
    /// The most refused keys a limit's page lists: the newest first.
    pub const LISTED_KEYS: usize = 100;

    /// The shortest secret [`Admin::secret`] takes, in bytes.
    pub const MIN_SECRET_BYTES: usize = 32;

    /// How long a page's Unlock, Block and Unblock buttons work after it is
    /// rendered: an older token is refused with a page that says to reload.
    pub const UNLOCK_TOKEN_LIFETIME: Duration = csrf::TOKEN_LIFETIME;

    /// The most audit entries a limit's page lists, and a looked-up key's
    /// audit: the newest first.
    pub const AUDIT_ENTRIES: usize = 20;

    /// Who the audit says acted when [`Admin::staff`] was not set, or
    /// named nobody.
    pub const UNNAMED_STAFF: &'static str = UNNAMED_STAFF;

    /// The admin of `limits` over `limiter`. Each limit must be the one the
    /// service uses (its max, window, strategy and lockout decide who is
    /// refused), and the limits' names must differ.
    pub fn new(
        limiter: impl Into<Arc<Limiter<S>>>,
        limits: impl IntoIterator<Item = Limit>,
    ) -> Self {
        Admin {
            limiter: limiter.into(),
            limits: limits.into_iter().collect(),
            secret: None,
            origin: None,
            clock: None,
            staff: None,
        }
    }

    /// The secret the page's tokens are signed with, at least
    /// [`Admin::MIN_SECRET_BYTES`] long: the same on every replica, so that
    /// a page rendered by one unlocks through any. Without it, each router
    /// draws a random secret of its own when built.
    pub fn secret(mut self, secret: &[u8]) -> Self {
        self.secret = Some(secret.to_vec());
        self
    }

    /// The page's origin as the staff's browsers see it,
    /// `https://staff.example.com` (and `:port` if not the scheme's
    /// default): an unlock's `Origin`, when sent, must be exactly it.
    /// Without it, `Origin` must name the request's host, under the
    /// request's scheme when its URI says it (HTTP/2) and `http` or `https`
    /// when not (HTTP/1.1: the page cannot know whether a proxy in front
    /// took TLS off, and `Forwarded` or `X-Forwarded-Proto` are anyone's to
    /// send).
    pub fn origin(mut self, origin: &str) -> Self {
        self.origin = Some(origin.to_owned());
        self
    }

    /// Who each unlock, block and unblock is by, as the audit keeps it:
    /// read from the request by `staff`, as the service's own
    /// authentication marks it (a header it sets, an extension). Set it, or
    /// the audit cannot say who: without it, or when it answers `None` or a
    /// blank name, the audit says [`Admin::UNNAMED_STAFF`]. A name is kept
    /// to its first 200 bytes (the audit's bound).
    ///
    /// ```
    /// # use platformkit_limit::{Limit, Limiter, Memory};
    /// # use platformkit_limit_admin::Admin;
    /// # use std::time::Duration;
    /// /// What the service's staff login puts in each request's extensions.
    /// #[derive(Clone)]
    /// struct StaffMember(String);
    ///
    /// # let login = Limit::new("login", 5, Duration::from_secs(900))?;
    /// let router = Admin::new(Limiter::new(Memory::new()), [login])
    ///     .staff(|request| request.extensions.get::<StaffMember>().map(|s| s.0.clone()))
    ///     .router()?;
    /// # drop(router);
    /// # Ok::<(), platformkit_limit::Error>(())
    /// ```
    pub fn staff(
        mut self,
        staff: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.staff = Some(Arc::new(staff));
        self
    }

    /// Pins the clock the page's tokens are issued and checked by, for
    /// tests (the system's unless given).
    pub fn clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The router, to mount under a path of the service with
    /// `nest_service`, behind its own authentication (see the
    /// [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](platformkit_limit::ErrorKind::InvalidOption) when
    /// two limits have one name, a limit is named `.` or `..` (no page can
    /// have that name in its path), the secret is shorter than
    /// [`Admin::MIN_SECRET_BYTES`], or none was given and the operating
    /// system has no random bytes for one, or the origin is not `http://`
    /// or `https://` and a host (and port) alone.
    pub fn router(self) -> Result<axum::Router, Error> {
        let mut names = HashSet::new();
        for limit in &self.limits {
            if !names.insert(limit.name()) {
                return Err(Error::invalid_option(
                    "limits",
                    format!("two limits are named {:?}", limit.name()),
                ));
            }
            if matches!(limit.name(), "." | "..") {
                return Err(Error::invalid_option(
                    "limits",
                    format!("a limit named {:?} cannot have a page", limit.name()),
                ));
            }
        }
        let guard = match self.secret {
            Some(secret) => {
                if secret.len() < Self::MIN_SECRET_BYTES {
                    return Err(Error::invalid_option(
                        "secret",
                        format!("at least {} bytes", Self::MIN_SECRET_BYTES),
                    ));
                }
                Guard::new(&secret)
            }
            None => Guard::random()?,
        };
        let origin = self.origin.as_deref().map(serialized_origin).transpose()?;
        let guard = guard.with_origin(origin).with_clock(self.clock);
        Ok(routes::router(routes::Admin {
            limiter: self.limiter,
            limits: self.limits,
            guard,
            staff: self.staff,
        }))
    }
}

/// The admin router of `limits` over `limiter`, with a random secret:
/// `Admin::new(limiter, limits).router()` (see [`Admin`] and the
/// [module docs](self)).
///
/// # Errors
///
/// As [`Admin::router`].
pub fn router<S: Store>(
    limiter: impl Into<Arc<Limiter<S>>>,
    limits: impl IntoIterator<Item = Limit>,
) -> Result<axum::Router, Error> {
    Admin::new(limiter, limits).router()
}
