//! The HTML of the admin pages: one inline style, no script. Every value
//! from outside the crate (a key, a typed text, the path the router is
//! nested under) goes through [`escape`].

use std::fmt::Write as _;

use std::time::Duration;

use platformkit_limit::{AuditEntry, Key, KeyStatus, Limit, Limiter, Strategy};

use super::csrf::{Action, EVERY_LIMIT, Guard};
use super::time::{at_and_in, span, utc};

const STYLE: &str = "\
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}\
header{background:#1d2330;color:#fff;padding:.7em 1.5em}\
header a{color:#cfe0ff;text-decoration:none}\
main{max-width:1040px;margin:0 auto;padding:1em 1.5em}\
h1{font-size:1.5em;margin:.4em 0 .1em}h2{font-size:1.1em;margin:1.4em 0 .5em}\
.meta,.hint{color:#5a6273;margin:.2em 0}\
table{border-collapse:collapse;width:100%;background:#fff}\
th,td{text-align:left;padding:.45em .7em;border-bottom:1px solid #e1e4ea;vertical-align:middle}\
th{font-size:.85em;color:#5a6273;font-weight:600;background:#eef0f4;white-space:nowrap}\
td.key{white-space:pre-wrap;font-family:ui-monospace,monospace;word-break:break-all;min-width:14em}\
code.key{white-space:pre-wrap;word-break:break-all}\
td.num{font-variant-numeric:tabular-nums;white-space:nowrap}\
small{color:#5a6273}\
form{margin:0}\
input[type=text]{font:inherit;padding:.35em .5em;width:26em;border:1px solid #b8bfcc;border-radius:4px}\
input.reason{width:14em}select{font:inherit;padding:.3em}\
form.act{margin:.6em 0}\
td.text{white-space:pre-wrap;word-break:break-word}\
button{font:inherit;padding:.3em .9em;border:1px solid #1d4ed8;border-radius:4px;background:#2563eb;color:#fff;cursor:pointer}\
.notice{padding:.6em 1em;border-radius:4px;margin:1em 0}\
.ok{background:#e3f5e8;border:1px solid #9ed3ac}.bad{background:#fdecec;border:1px solid #f0a8a8}\
.refused{color:#b42318;font-weight:600}";

/// `text` with `&`, `<`, `>`, `"` and `'` as character references: safe
/// in an element and in a quoted attribute.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A whole page: `title` (escaped here), the header's trail back to the
/// index at `index` (none on the index itself), and `body`, HTML already
/// escaped.
fn page(index: &str, title: Option<&str>, body: &str) -> String {
    let (head_title, trail) = match title {
        Some(title) => (
            format!("{} · rate limits", escape(title)),
            format!(
                "<a href=\"{}\">Rate limits</a> › {}",
                escape(index),
                escape(title)
            ),
        ),
        None => ("Rate limits".to_owned(), "Rate limits".to_owned()),
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{head_title}</title><style>{STYLE}</style></head>\
         <body><header>{trail}</header><main>{body}</main></body></html>\n"
    )
}

/// The index's address under `base`, the path the router is nested under.
fn index_href(base: &str) -> String {
    if base.is_empty() {
        "/".to_owned()
    } else {
        base.to_owned()
    }
}

/// The page of limit `name` under `base`.
pub(super) fn limit_href(base: &str, name: &str) -> String {
    format!("{base}/{name}")
}

/// Where a key is unlocked under every limit, under `base`: a path no
/// limit's page can have (a limit's name holds no `~`).
pub(super) fn every_limit_unlock_href(base: &str) -> String {
    format!("{base}/~all/unlock")
}

/// What the index shows.
pub(super) struct IndexPage<'a> {
    pub(super) base: &'a str,
    pub(super) limits: &'a [Limit],
    pub(super) guard: &'a Guard,
    /// The key looked up: its status under each limit, in their order.
    pub(super) lookup: Option<Lookup<Vec<KeyStatus>>>,
    /// The key's audit entries under the router's limits, newest first.
    pub(super) key_audit: Option<&'a [AuditEntry]>,
    /// After an unlock under every limit: each limit that held windows of
    /// the key, and how many went.
    pub(super) cleared: Option<Vec<(&'a str, u64)>>,
}

/// The index: what an unlock under every limit cleared, the lookup form
/// and the key's status under every limit, then every limit of the router.
pub(super) fn index(view: &IndexPage<'_>) -> String {
    let (base, limits) = (view.base, view.limits);
    let mut body = String::from(
        "<h1>Rate limits</h1><p class=\"meta\">Open a limit to see who it refuses \
         now, look up a key, or unlock one.</p>",
    );
    match view.cleared.as_deref() {
        Some([]) => body.push_str(
            "<p class=\"notice ok\">Nothing to reset: no limit held a count of the key.</p>",
        ),
        Some(cleared) => {
            let each: Vec<String> = cleared
                .iter()
                .map(|(name, windows)| {
                    let plural = if *windows == 1 { "" } else { "s" };
                    format!("{}: {windows} window{plural}", escape(name))
                })
                .collect();
            let _ = write!(
                body,
                "<p class=\"notice ok\">Unlocked under every limit: {}.</p>",
                each.join("; ")
            );
        }
        None => {}
    }
    body.push_str(&lookup_form(
        "Look up a key under every limit",
        &index_href(base),
        view.lookup.as_ref(),
    ));
    match &view.lookup {
        Some(Lookup::Found { status, .. }) => {
            body.push_str(&every_limit(base, status, view.guard));
            if let Some(entries) = view.key_audit {
                body.push_str(&audit_table(
                    "The key's audit",
                    "Nothing was done to the key under these limits, among the newest \
                     actions audited.",
                    entries,
                    Column::Limit,
                ));
            }
        }
        Some(Lookup::Invalid { reason, .. }) => body.push_str(&not_a_key(reason)),
        None => {}
    }
    body.push_str(
        "<h2>Limits</h2><table><thead><tr><th>Limit</th>\
         <th>Max</th><th>Window</th><th>Lockout</th></tr></thead><tbody>",
    );
    for limit in limits {
        let _ = write!(
            body,
            "<tr><td><a href=\"{href}\">{name}</a></td><td class=\"num\">{max}</td>\
             <td class=\"num\">{window} <small>{strategy}</small></td><td class=\"num\">{lockout}</td></tr>",
            href = escape(&limit_href(base, limit.name())),
            name = escape(limit.name()),
            max = limit.max(),
            window = span(limit.window()),
            strategy = strategy(limit.strategy()),
            lockout = limit.lockout().map_or("—".to_owned(), span),
        );
    }
    if limits.is_empty() {
        body.push_str("<tr><td colspan=\"4\">No limits were given to this page.</td></tr>");
    }
    body.push_str("</tbody></table>");
    page(&index_href(base), None, &body)
}

/// A key's status under each limit, one row a limit, and the form that
/// unlocks it under every limit when any holds a count of it.
fn every_limit(base: &str, statuses: &[KeyStatus], guard: &Guard) -> String {
    let Some(first) = statuses.first() else {
        return "<p class=\"meta\">No limits were given to this page.</p>".to_owned();
    };
    let mut out = format!(
        "<p class=\"meta\">The key <code class=\"key\">{key}</code> under every limit; \
         times are UTC, read from the database at {at}.</p><table><thead><tr>\
         <th>Limit</th><th>Count</th><th>Now</th><th>Reopens</th><th>Lockout until</th>\
         </tr></thead><tbody>",
        key = escape(&shown_key(first.key())),
        at = utc(first.read_at()),
    );
    for status in statuses {
        let now = status.read_at();
        let verdict = if status.is_refused() {
            "<span class=\"refused\">refused</span>"
        } else {
            "allowed"
        };
        let _ = write!(
            out,
            "<tr><td class=\"limit\"><a href=\"{href}\">{name}</a></td>\
             <td class=\"num\">{count}</td><td>{verdict}</td><td class=\"num\">{reopens}</td>\
             <td class=\"num\">{locked}</td></tr>",
            href = escape(&limit_href(base, status.limit())),
            name = escape(status.limit()),
            count = count(status),
            reopens = status
                .reopens_at()
                .map_or("open now".to_owned(), |at| at_and_in(at, now)),
            locked = status
                .locked_until()
                .map_or("—".to_owned(), |at| at_and_in(at, now)),
        );
    }
    out.push_str("</tbody></table>");
    if statuses.iter().any(|s| s.count() > 0 || s.is_refused()) {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"{action}\" class=\"act\">\
             <input type=\"hidden\" name=\"key\" value=\"{key}\">\
             <input type=\"hidden\" name=\"token\" value=\"{token}\">\
             {reason} <button type=\"submit\">Unlock under every limit</button></form>",
            action = escape(&every_limit_unlock_href(base)),
            key = escape(first.key()),
            token = guard.token(Action::Unlock, EVERY_LIMIT, first.key()),
            reason = reason_field("unlock"),
        );
    } else {
        out.push_str("<p class=\"meta\">No limit holds a count of the key: nothing to clear.</p>");
    }
    out
}

/// What a looked-up key showed: its status (under one limit, or each).
pub(super) enum Lookup<T> {
    /// The key's status.
    Found { typed: String, status: T },
    /// The text typed is no key.
    Invalid { typed: String, reason: String },
}

/// The lookup form, under the heading `heading`, posting to `action`, with
/// the text of `lookup` typed in it.
fn lookup_form<T>(heading: &str, action: &str, lookup: Option<&Lookup<T>>) -> String {
    let typed = match lookup {
        Some(Lookup::Found { typed, .. } | Lookup::Invalid { typed, .. }) => typed.as_str(),
        None => "",
    };
    format!(
        "<h2>{heading}</h2><form method=\"post\" action=\"{action}\">\
         <input type=\"text\" name=\"key\" value=\"{typed}\" \
         placeholder=\"alice@example.com\" aria-label=\"key\" required> \
         <button type=\"submit\">Look up</button></form>\
         <p class=\"hint\">Type an email address or an IP address, or a key as \
         this page shows it (<code>email|alice@example.com</code>); a username as \
         <code>user:bob</code>.</p>",
        heading = escape(heading),
        action = escape(action),
        typed = escape(typed),
    )
}

/// What a lookup of a text that is no key says.
fn not_a_key(reason: &str) -> String {
    format!("<p class=\"notice bad\">Not a key: {}.</p>", escape(reason))
}

/// A notice above a limit's page: what the action posted from it did.
pub(super) enum Notice {
    Unlocked,
    Blocked,
    Unblocked,
    /// An unblock of a key that had no block.
    NotBlocked,
}

/// What a limit's page shows.
pub(super) struct LimitPage<'a> {
    pub(super) base: &'a str,
    pub(super) limit: &'a Limit,
    pub(super) guard: &'a Guard,
    pub(super) refused: &'a [KeyStatus],
    /// Whether the list may be cut: as long as asked for.
    pub(super) more: bool,
    pub(super) lookup: Option<Lookup<KeyStatus>>,
    /// The looked-up key's audit entries, newest first.
    pub(super) key_audit: Option<&'a [AuditEntry]>,
    /// The limit's newest audit entries.
    pub(super) audit: &'a [AuditEntry],
    pub(super) notice: Option<Notice>,
}

/// A limit's page: a notice, the lookup form and its result, the refused
/// keys with an Unlock button each.
pub(super) fn limit_page(view: &LimitPage<'_>) -> String {
    let limit = view.limit;
    let href = limit_href(view.base, limit.name());
    let unlock = format!("{href}/unlock");
    let mut body = format!(
        "<h1>{name}</h1><p class=\"meta\">At most {max} per key in each {window} \
         window ({strategy}){lockout}.</p>",
        name = escape(limit.name()),
        max = limit.max(),
        window = span(limit.window()),
        strategy = strategy(limit.strategy()),
        lockout = limit.lockout().map_or(String::new(), |l| format!(
            "; a full window locks the key out for {}",
            span(l)
        )),
    );
    body.push_str(match view.notice {
        Some(Notice::Unlocked) => {
            "<p class=\"notice ok\">Unlocked: the key's count is cleared.</p>"
        }
        Some(Notice::Blocked) => {
            "<p class=\"notice ok\">Blocked: the limit refuses the key until the block \
             ends, whatever its count (the audit below says until when).</p>"
        }
        Some(Notice::Unblocked) => {
            "<p class=\"notice ok\">Unblocked: the key's block is ended, its count kept.</p>"
        }
        Some(Notice::NotBlocked) => {
            "<p class=\"notice bad\">Nothing to unblock: the key had no block. A lockout \
             ends with Unlock.</p>"
        }
        None => "",
    });

    body.push_str(&lookup_form("Look up a key", &href, view.lookup.as_ref()));
    match &view.lookup {
        Some(Lookup::Found { status, .. }) => {
            body.push_str(&table_head());
            body.push_str(&row(status, &unlock, view.guard, limit.name()));
            body.push_str("</tbody></table>");
            body.push_str(&block_forms(&href, limit, status, view.guard));
            if let Some(entries) = view.key_audit {
                body.push_str(&audit_table(
                    "The key's audit",
                    "Nothing was done to the key under this limit, among its newest \
                     actions audited.",
                    entries,
                    Column::None,
                ));
            }
        }
        Some(Lookup::Invalid { reason, .. }) => body.push_str(&not_a_key(reason)),
        None => {}
    }

    let _ = write!(body, "<h2>Refused now ({})</h2>", view.refused.len());
    let read_at = match (&view.lookup, view.refused.first()) {
        (_, Some(status)) | (Some(Lookup::Found { status, .. }), None) => Some(status.read_at()),
        _ => None,
    };
    if let Some(at) = read_at {
        let _ = write!(
            body,
            "<p class=\"meta\">Times are UTC; read from the database at {}.</p>",
            utc(at)
        );
    }
    if view.refused.is_empty() {
        body.push_str("<p class=\"meta\">Nobody is refused now.</p>");
    } else {
        body.push_str(&table_head());
        for status in view.refused {
            body.push_str(&row(status, &unlock, view.guard, limit.name()));
        }
        body.push_str("</tbody></table>");
        if view.more {
            let _ = write!(
                body,
                "<p class=\"meta\">The newest {} are shown.</p>",
                view.refused.len()
            );
        }
    }
    body.push_str(&audit_table(
        "Audit",
        "Nothing was done to a key under this limit yet.",
        view.audit,
        Column::Key,
    ));
    page(&index_href(view.base), Some(limit.name()), &body)
}

/// How long a block from the page lasts: the choices of its list, in
/// seconds, and as the list shows them.
const BLOCK_CHOICES: [(u64, &str); 5] = [
    (15 * 60, "15 minutes"),
    (60 * 60, "1 hour"),
    (24 * 60 * 60, "1 day"),
    (7 * 24 * 60 * 60, "7 days"),
    (30 * 24 * 60 * 60, "30 days"),
];

/// The choices of [`BLOCK_CHOICES`] a block under `limit` may last: with
/// the limit's window, within the longest window a block is kept for.
pub(super) fn block_choices(limit: &Limit) -> impl Iterator<Item = (u64, &'static str)> {
    let window = limit.window();
    BLOCK_CHOICES.into_iter().filter(move |(secs, _)| {
        let block_for = Duration::from_secs(*secs);
        block_for <= Limiter::MAX_BLOCK
            && block_for + window + Duration::from_secs(2) <= Limit::MAX_WINDOW
    })
}

/// The text field of an action's reason, which the audit keeps.
fn reason_field(action: &str) -> String {
    format!(
        "<input type=\"text\" class=\"reason\" name=\"reason\" maxlength=\"1000\" \
         placeholder=\"why (ticket, request)\" aria-label=\"reason for the {action}\" required>"
    )
}

/// The Block form of a looked-up key under its limit (at `href`), and its
/// Unblock form when a block (or a lockout) is running.
fn block_forms(href: &str, limit: &Limit, status: &KeyStatus, guard: &Guard) -> String {
    let key = status.key();
    let mut choices = String::new();
    for (secs, shown) in block_choices(limit) {
        let _ = write!(choices, "<option value=\"{secs}\">{shown}</option>");
    }
    let mut out = String::new();
    if !choices.is_empty() {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"{action}\" class=\"act\">\
             <input type=\"hidden\" name=\"key\" value=\"{key}\">\
             <input type=\"hidden\" name=\"token\" value=\"{token}\">\
             <label>Block for <select name=\"for\">{choices}</select></label> {reason} \
             <button type=\"submit\">Block</button> <small>the limit refuses the key \
             until then, whatever its count</small></form>",
            action = escape(&format!("{href}/block")),
            key = escape(key),
            token = guard.token(Action::Block, limit.name(), key),
            reason = reason_field("block"),
        );
    }
    if let Some(until) = status.locked_until() {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"{action}\" class=\"act\">\
             <input type=\"hidden\" name=\"key\" value=\"{key}\">\
             <input type=\"hidden\" name=\"token\" value=\"{token}\">\
             {reason} <button type=\"submit\">Unblock</button> <small>blocked or locked \
             out until {until}; its count is kept</small></form>",
            action = escape(&format!("{href}/unblock")),
            key = escape(key),
            token = guard.token(Action::Unblock, limit.name(), key),
            reason = reason_field("unblock"),
            until = utc(until),
        );
    }
    out
}

/// What an audit table shows besides when, who, what, until and why.
#[derive(Clone, Copy)]
enum Column {
    /// Each entry's key: the limit's entries.
    Key,
    /// Each entry's limit: one key's entries under every limit.
    Limit,
    /// Nothing: one key's entries under one limit.
    None,
}

/// Audit entries under the heading `heading` (or `none` when there are
/// none), newest first: when, who, what, the key or the limit, until, why.
/// Who, the key and why are whatever was typed, so escaped; the key is
/// shown as a row shows it.
fn audit_table(heading: &str, none: &str, entries: &[AuditEntry], column: Column) -> String {
    let mut out = format!("<h2>{}</h2>", escape(heading));
    if entries.is_empty() {
        let _ = write!(out, "<p class=\"meta\">{}</p>", escape(none));
        return out;
    }
    let _ = write!(
        out,
        "<p class=\"meta\">Newest first; times are UTC.</p>\
         <table class=\"audit\"><thead><tr><th>When</th><th>Who</th><th>What</th>{extra}\
         <th>Until</th><th>Why</th></tr></thead><tbody>",
        extra = match column {
            Column::Key => "<th>Key</th>",
            Column::Limit => "<th>Limit</th>",
            Column::None => "",
        },
    );
    for entry in entries {
        let what = match entry.windows() {
            Some(windows) if entry.until().is_none() => {
                format!(
                    "{} <small>{windows} cleared</small>",
                    entry.action().as_str()
                )
            }
            _ => entry.action().as_str().to_owned(),
        };
        let extra = match column {
            Column::Key => format!(
                "<td class=\"key audited\">{}</td>",
                escape(&shown_key(entry.key()))
            ),
            Column::Limit => format!("<td>{}</td>", escape(entry.limit())),
            Column::None => String::new(),
        };
        let _ = write!(
            out,
            "<tr class=\"entry\"><td class=\"num\">{at}</td><td class=\"text\">{by}</td>\
             <td>{what}</td>{extra}<td class=\"num\">{until}</td>\
             <td class=\"text\">{reason}</td></tr>",
            at = utc(entry.at()),
            by = escape(entry.by()),
            until = entry.until().map_or("—".to_owned(), utc),
            reason = escape(entry.reason()),
        );
    }
    out.push_str("</tbody></table>");
    out
}

fn table_head() -> String {
    "<table><thead><tr><th>Key</th><th>Count</th><th>Window ends</th>\
     <th>Reopens</th><th>Lockout until</th><th></th></tr></thead><tbody>"
        .to_owned()
}

/// One key's row, with its Unlock form when there is anything to clear.
fn row(status: &KeyStatus, unlock: &str, guard: &Guard, limit: &str) -> String {
    let now = status.read_at();
    let count = count(status);
    let reopens = status
        .reopens_at()
        .map_or("open now".to_owned(), |at| at_and_in(at, now));
    let locked = status
        .locked_until()
        .map_or("—".to_owned(), |at| at_and_in(at, now));
    let button = if status.count() > 0 || status.is_refused() {
        format!(
            "<form method=\"post\" action=\"{action}\">\
             <input type=\"hidden\" name=\"key\" value=\"{key}\">\
             <input type=\"hidden\" name=\"token\" value=\"{token}\">\
             {reason} <button type=\"submit\">Unlock</button></form>",
            action = escape(unlock),
            key = escape(status.key()),
            token = guard.token(Action::Unlock, limit, status.key()),
            reason = reason_field("unlock"),
        )
    } else {
        "<small>nothing to clear</small>".to_owned()
    };
    format!(
        "<tr><td class=\"key\">{key}</td><td class=\"num\">{count}</td>\
         <td class=\"num\">{window_end}</td><td class=\"num\">{reopens}</td>\
         <td class=\"num\">{locked}</td><td>{button}</td></tr>",
        key = escape(&shown_key(status.key())),
        window_end = at_and_in(status.window_end(), now),
    )
}

/// A key's count of its limit's max, marked when the limit refuses it.
fn count(status: &KeyStatus) -> String {
    let count = format!("{} / {}", status.count(), status.max());
    if status.is_refused() {
        format!("<span class=\"refused\">{count}</span>")
    } else {
        count
    }
}

/// A stored key as a row shows it: its spelling ([`Key::spelling`]),
/// which typed in the lookup finds it. A stored text that no key encodes
/// to (a row written by hand) is quoted, with Rust's escapes.
fn shown_key(stored: &str) -> String {
    Key::from_encoded(stored).map_or_else(|| format!("{stored:?}"), |key| key.spelling())
}

/// An error page's body: a heading and a message (escaped here).
pub(super) fn error_page(base: &str, title: &str, message: &str) -> String {
    let body = format!(
        "<h1>{}</h1><p class=\"notice bad\">{}</p>",
        escape(title),
        escape(message)
    );
    page(&index_href(base), Some(title), &body)
}

fn strategy(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Sliding => "sliding",
        _ => "fixed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_markup() {
        assert_eq!(
            escape(r#"<script>alert('x')</script>&"q""#),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;q&quot;"
        );
        assert_eq!(escape("email|alice@example.com"), "email|alice@example.com");
    }

    #[test]
    fn a_row_shows_a_key_as_it_is_typed() {
        let long = Key::opaque(&"<b>".repeat(100));
        assert!(long.is_digested());
        for key in [long, Key::new(["alice@example.com"]).unwrap()] {
            assert_eq!(shown_key(key.as_str()), key.spelling());
        }
        assert_eq!(shown_key("id|a~b"), r#""id|a~b""#, "no key: quoted");
    }
}
