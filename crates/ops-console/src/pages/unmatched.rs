//! Unmatched payments: events no order matched when they arrived, oldest
//! first, with their age and the order that has their payment id now, if
//! one does; each can be replayed on it or discarded with a reason.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use process::terminal::age;
use serde::Deserialize;
use time::OffsetDateTime;

use crate::auth::Session;
use crate::config::Actions;
use crate::html::{self, csrf_field, esc, event_link, or_dash, order_link, url_part, when};
use crate::pages::{db_error, respond, signed_in};
use crate::state::State;
use crate::storage::{self, Unmatched, UnmatchedFilter};

const PAGE: i64 = 50;

#[derive(Debug, Deserialize)]
pub struct Query {
    /// The last row of the previous page: its first delivery (Unix ns) and id.
    after_ns: Option<i128>,
    after_id: Option<String>,
}

pub async fn list(state: web::Data<State>, req: HttpRequest, query: web::Query<Query>) -> HttpResponse {
    let session = match signed_in(&state, &req) {
        Ok(s) => s,
        Err(to_sign_in) => return *to_sign_in,
    };
    let after = query
        .after_ns
        .and_then(|ns| OffsetDateTime::from_unix_timestamp_nanos(ns).ok())
        .zip(query.after_id.clone());
    let filter = UnmatchedFilter {
        after,
        payment_id: None,
        limit: PAGE,
    };
    let rows = async {
        let client = state.pool.get().await?;
        anyhow::Ok(storage::unmatched_page(&client, &filter).await?)
    };
    let rows = match rows.await {
        Ok(rows) => rows,
        Err(e) => return db_error(&session, &format!("{e:#}")),
    };
    let mut body = table(&session, &state, &rows, "Payments no order matched, oldest first");
    if let Some(last) = rows.last().filter(|_| rows.len() as i64 == PAGE) {
        body.push_str(&format!(
            "<p><a href=\"/unmatched?after_ns={}&amp;after_id={}\">Next page</a></p>\n",
            last.processed_at.unix_timestamp_nanos(),
            url_part(&last.event_id)
        ));
    }
    respond(
        StatusCode::OK,
        html::page("Unmatched payments", Some(&session), &body),
    )
}

/// The table of unmatched payments, with their actions when actions are on.
pub fn table(session: &Session, state: &State, rows: &[Unmatched], caption: &str) -> String {
    let actions = state.console.actions == Actions::On;
    let mut head = vec![
        "Event",
        "Type",
        "Payment id",
        "First delivered",
        "Waiting for",
        "Deliveries",
        "Order now",
    ];
    if actions {
        head.push("Settle");
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|u| {
            let mut cells = vec![
                event_link(&u.event_id),
                esc(&u.event_type),
                or_dash(u.payment_id.as_deref()),
                when(u.processed_at),
                age(u.age_seconds),
                u.deliveries.to_string(),
                u.order_id.map_or_else(|| "none yet".into(), order_link),
            ];
            if actions {
                cells.push(settle_cell(session, u));
            }
            cells
        })
        .collect();
    if rows.is_empty() {
        return "<p>No unmatched payments.</p>\n".into();
    }
    html::table(caption, &head, &rows)
}

fn settle_cell(session: &Session, u: &Unmatched) -> String {
    let id = url_part(&u.event_id);
    let csrf = csrf_field(session);
    let replay = if u.order_id.is_some() {
        format!(
            "<form method=\"post\" action=\"/events/{id}/replay\">{csrf}<button type=\"submit\">Replay on order {}</button></form>",
            u.order_id.unwrap_or_default()
        )
    } else {
        String::new()
    };
    let field = format!("reason-{}", esc(&id));
    format!(
        r#"{replay}<form method="post" action="/events/{id}/discard">{csrf}<label for="{field}">Why discard {event}</label>
<input id="{field}" name="reason" required maxlength="500"><button type="submit">Discard</button></form>"#,
        event = esc(&u.event_id),
    )
}
