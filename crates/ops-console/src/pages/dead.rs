//! Dead letters: a page of them, filtered by kind, each shown whole with
//! what can be done to it; requeueing every one of a kind starts with a
//! count of what it would requeue (`actions::requeue_kind`).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use domain::CommandKind;
use outbox_relay::storage::{self as relay, DeadFilter};
use serde::Deserialize;

use crate::config::Actions;
use crate::html::{self, csrf_field, esc, event_link, or_dash, order_link, url_part, when};
use crate::pages::{db_error, missing, respond, signed_in};
use crate::state::State;

/// Rows per page.
pub const PAGE: i64 = 50;

#[derive(Debug, Deserialize)]
pub struct Query {
    kind: Option<String>,
    after: Option<i64>,
}

pub async fn list(state: web::Data<State>, req: HttpRequest, query: web::Query<Query>) -> HttpResponse {
    let session = match signed_in(&state, &req) {
        Ok(s) => s,
        Err(to_sign_in) => return *to_sign_in,
    };
    let kind = query.kind.clone().filter(|k| !k.is_empty());
    let filter = DeadFilter {
        kind: kind.clone(),
        limit: PAGE,
        after: query.after,
    };
    let page = async {
        let client = state.pool.get().await?;
        anyhow::Ok(relay::dead_rows(&client, &filter).await?)
    };
    let page = match page.await {
        Ok(page) => page,
        Err(e) => return db_error(&session, &format!("{e:#}")),
    };
    let options: String = std::iter::once(("", "every kind"))
        .chain(CommandKind::ALL.iter().map(|k| (k.as_str(), k.as_str())))
        .map(|(value, label)| {
            let selected = if kind.as_deref() == Some(value) {
                " selected"
            } else {
                ""
            };
            format!("<option value=\"{value}\"{selected}>{label}</option>")
        })
        .collect();
    let mut body = format!(
        r#"<form method="get" action="/dead" class="filter">
<label for="kind">Kind</label>
<select id="kind" name="kind">{options}</select>
<button type="submit">Show</button>
</form>
"#
    );
    let rows: Vec<Vec<String>> = page
        .rows
        .iter()
        .map(|r| {
            vec![
                format!("<a href=\"/dead/{}\">{}</a>", r.id, r.id),
                esc(&r.kind),
                order_link(r.order_id),
                event_link(&r.event_id),
                r.attempts.to_string(),
                or_dash(r.last_error.as_deref()),
                r.finished_at.map_or_else(|| "-".into(), when),
            ]
        })
        .collect();
    let of = kind
        .as_deref()
        .map_or_else(String::new, |k| format!(" of kind {}", esc(k)));
    body.push_str(&html::table(
        &format!("{} dead letter(s){of}, oldest first", page.total),
        &[
            "Command",
            "Kind",
            "Order",
            "Enqueued by",
            "Attempts",
            "Last error",
            "Died",
        ],
        &rows,
    ));
    if let Some(last) = page.rows.last().filter(|_| page.rows.len() as i64 == PAGE) {
        let kind_part = kind
            .as_deref()
            .map_or_else(String::new, |k| format!("kind={}&", url_part(k)));
        body.push_str(&format!(
            "<p><a href=\"/dead?{kind_part}after={}\">Next page</a></p>\n",
            last.id
        ));
    }
    if state.console.actions == Actions::On && page.total > 0 {
        body.push_str(&format!(
            r#"<form method="post" action="/dead/requeue" class="bulk">{csrf}
<input type="hidden" name="kind" value="{kind}">
<button type="submit">Requeue every dead letter{of}…</button>
</form>
"#,
            csrf = csrf_field(&session),
            kind = esc(kind.as_deref().unwrap_or("")),
        ));
    }
    respond(StatusCode::OK, html::page("Dead letters", Some(&session), &body))
}

pub async fn show(state: web::Data<State>, req: HttpRequest, id: web::Path<i64>) -> HttpResponse {
    let session = match signed_in(&state, &req) {
        Ok(s) => s,
        Err(to_sign_in) => return *to_sign_in,
    };
    let id = id.into_inner();
    let row = async {
        let client = state.pool.get().await?;
        anyhow::Ok(relay::outbox_row(&client, id).await?)
    };
    let row = match row.await {
        Ok(Some(row)) => row,
        Ok(None) => {
            return missing(
                &session,
                "No such command",
                &format!("No outbox row {id} (or removed by retention)."),
            );
        }
        Err(e) => return db_error(&session, &format!("{e:#}")),
    };
    let mut body = html::facts(&[
        ("Kind", esc(&row.kind)),
        ("Status", esc(&row.status)),
        ("Order", order_link(row.order_id)),
        ("Enqueued by", event_link(&row.event_id)),
        (
            "Idempotency key",
            format!("<code>{}</code>", esc(&row.idempotency_key)),
        ),
        ("Attempts (claims)", format!("{} ({})", row.attempts, row.claims)),
        ("Last error", or_dash(row.last_error.as_deref())),
        ("Enqueued", when(row.created_at)),
        ("Due", when(row.available_at)),
        ("Done", row.finished_at.map_or_else(|| "-".into(), when)),
        (
            "Held by",
            match (&row.lease_owner, row.leased_until) {
                (Some(owner), Some(until)) => format!("{} until {}", esc(owner), when(until)),
                _ => "-".into(),
            },
        ),
    ]);
    body.push_str(&format!(
        "<details><summary>What it sends</summary><pre>{}</pre></details>\n",
        esc(&row.payload)
    ));
    if row.status == "dead" && state.console.actions == Actions::On {
        body.push_str(&format!(
            r#"<section aria-labelledby="act"><h2 id="act">Act on it</h2>
<form method="post" action="/dead/{id}/requeue">{csrf}<button type="submit">Requeue it (pending, due now, attempts reset)</button></form>
<form method="post" action="/dead/{id}/discard">{csrf}
<label for="discard-reason">Why discard it</label>
<input id="discard-reason" name="reason" required maxlength="500">
<button type="submit">Discard it</button></form>
</section>
"#,
            csrf = csrf_field(&session),
        ));
    }
    respond(
        StatusCode::OK,
        html::page(&format!("Command {id}"), Some(&session), &body),
    )
}
