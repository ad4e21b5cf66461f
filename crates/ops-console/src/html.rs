//! Pages as text: every value that comes from the database or a request is
//! written through [`esc`] (payloads, errors and ids are the provider's or an
//! attacker's text), and every page through [`page`], whose headers (set in
//! `server.rs`) forbid framing and any script.

use std::fmt::Write as _;

use time::OffsetDateTime;

use crate::auth::Session;

/// `text` safe between tags and inside a quoted attribute.
pub fn esc(text: &str) -> String {
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

/// `text` as one component of a URL path or query (RFC 3986 unreserved kept).
pub fn url_part(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A link to an event's story.
pub fn event_link(id: &str) -> String {
    format!("<a href=\"/events/{}\">{}</a>", url_part(id), esc(id))
}

/// A link to an order's page.
pub fn order_link(id: i64) -> String {
    format!("<a href=\"/orders/{id}\">{id}</a>")
}

/// A time as the CLI prints it (UTC, milliseconds).
pub fn when(at: OffsetDateTime) -> String {
    process::terminal::utc_millis(at)
}

/// A whole page: the navigation and search form, then `body` under an `<h1>`
/// of `title` (both already HTML; `title` escaped by the caller).
pub fn page(title: &str, session: Option<&Session>, body: &str) -> String {
    let nav = match session {
        Some(session) => format!(
            r#"<header><nav aria-label="Console"><ul>
<li><a href="/">Backlog</a></li>
<li><a href="/dead">Dead letters</a></li>
<li><a href="/unmatched">Unmatched payments</a></li>
</ul>
<form method="post" action="/logout" class="signout">{csrf}<button type="submit">Sign out {operator}</button></form>
</nav>
<form role="search" method="get" action="/search" class="search">
<label for="q">Event id (or prefix*), payment id or order id</label>
<input id="q" name="q" type="search" required>
<button type="submit">Search</button>
</form></header>"#,
            csrf = csrf_field(session),
            operator = esc(&session.operator),
        ),
        None => String::new(),
    };
    format!(
        r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · ops-console</title>
<link rel="stylesheet" href="/style.css">
</head>
<body>
<a class="skip" href="#main">Skip to the content</a>
{nav}
<main id="main">
<h1>{title}</h1>
{body}
</main>
</body>
</html>
"##
    )
}

/// The hidden field every form that changes something carries.
pub fn csrf_field(session: &Session) -> String {
    format!(
        r#"<input type="hidden" name="csrf" value="{}">"#,
        esc(&session.csrf)
    )
}

/// A definition list of `(term, value-as-HTML)`.
pub fn facts(rows: &[(&str, String)]) -> String {
    let mut out = String::from("<dl class=\"facts\">\n");
    for (term, value) in rows {
        let _ = writeln!(out, "<dt>{}</dt><dd>{value}</dd>", esc(term));
    }
    out.push_str("</dl>\n");
    out
}

/// A table: `caption`, the header cells, and each row's cells (HTML).
pub fn table(caption: &str, head: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("<table>\n<caption>{}</caption>\n<thead><tr>", esc(caption));
    for cell in head {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(cell));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    out
}

/// An optional value, escaped, or `-`.
pub fn or_dash(value: Option<&str>) -> String {
    value.map_or_else(|| "-".to_owned(), esc)
}

/// A paragraph saying what happened (`role="status"` for screen readers).
pub fn notice(text_html: &str) -> String {
    format!("<p class=\"notice\" role=\"status\">{text_html}</p>\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_text_is_text() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
    }

    #[test]
    fn a_url_part_cannot_leave_its_component() {
        assert_eq!(url_part("evt_1/../x?y=\"z\""), "evt_1%2F..%2Fx%3Fy%3D%22z%22");
    }
}
