//! One event's story, as `webhook-ingest events show` tells it (its
//! deliveries, the stored answer, the trace, its order and the order's
//! commands), an order's, and the search that finds them by event id (or a
//! prefix), payment id or order id.

use std::collections::BTreeSet;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use domain::EventOutcome;
use serde::Deserialize;
use webhook_ingest::storage::{self as ingest, CommandRow, EventDetail, EventFilter};

use crate::config::Actions;
use crate::html::{self, csrf_field, esc, event_link, or_dash, order_link, url_part, when};
use crate::pages::{db_error, missing, respond, signed_in, unmatched};
use crate::state::State;
use crate::storage::{self, Order, UnmatchedFilter};

#[derive(Debug, Deserialize)]
pub struct Query {
    q: Option<String>,
}

/// The most rows a search lists of each kind.
const FOUND: i64 = 50;

pub async fn search(state: web::Data<State>, req: HttpRequest, query: web::Query<Query>) -> HttpResponse {
    let session = match signed_in(&state, &req) {
        Ok(s) => s,
        Err(to_sign_in) => return *to_sign_in,
    };
    let q = query.q.as_deref().unwrap_or("").trim();
    if q.is_empty() {
        return see_other("/");
    }
    let read = async {
        let client = state.pool.get().await?;
        if let Some(prefix) = q.strip_suffix('*') {
            let filter = EventFilter {
                status: None,
                id: None,
                id_prefix: Some(prefix.to_owned()),
                since: None,
                after: None,
                limit: FOUND,
            };
            return anyhow::Ok((
                ingest::list_events(&client, &filter).await?,
                Vec::new(),
                Vec::new(),
            ));
        }
        if ingest::show_event(&client, q).await?.is_some() {
            return Ok((Vec::new(), Vec::new(), Vec::new()));
        }
        let orders = storage::find_orders(&client, q.parse().ok(), Some(q)).await?;
        let filter = UnmatchedFilter {
            payment_id: Some(q.to_owned()),
            limit: FOUND,
            ..UnmatchedFilter::default()
        };
        Ok((
            Vec::new(),
            orders,
            storage::unmatched_page(&client, &filter).await?,
        ))
    };
    let (events, orders, payments) = match read.await {
        Ok(found) => found,
        Err(e) => return db_error(&session, &format!("{e:#}")),
    };
    if !q.ends_with('*') && events.is_empty() && orders.is_empty() && payments.is_empty() {
        // An event id (the common case at 3 a.m.), or nothing at all.
        return see_other(&format!("/events/{}", url_part(q)));
    }
    if let ([order], []) = (orders.as_slice(), payments.as_slice()) {
        return see_other(&format!("/orders/{}", order.id));
    }
    let mut body = String::new();
    if !events.is_empty() || q.ends_with('*') {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                vec![
                    event_link(&e.event_id),
                    esc(&e.event_type),
                    esc(e.status.as_str()),
                    when(e.processed_at),
                    e.order_id.map_or_else(|| "-".into(), order_link),
                ]
            })
            .collect();
        body.push_str(&html::table(
            &format!(
                "Events whose id starts with {} (newest first, at most {FOUND})",
                q.trim_end_matches('*')
            ),
            &["Event", "Type", "Status", "First delivered", "Order"],
            &rows,
        ));
    }
    for order in &orders {
        body.push_str(&format!(
            "<p>Order {} has this id or payment id.</p>\n",
            order_link(order.id)
        ));
    }
    if !payments.is_empty() {
        body.push_str(&unmatched::table(
            &session,
            &state,
            &payments,
            "Unmatched payments with this payment id",
        ));
    }
    respond(
        StatusCode::OK,
        html::page(&format!("Search: {}", esc(q)), Some(&session), &body),
    )
}

fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header(("Location", location.to_owned()))
        .finish()
}

pub async fn event(state: web::Data<State>, req: HttpRequest, id: web::Path<String>) -> HttpResponse {
    let session = match signed_in(&state, &req) {
        Ok(s) => s,
        Err(to_sign_in) => return *to_sign_in,
    };
    let read = async {
        let client = state.pool.get().await?;
        let Some(event) = ingest::show_event(&client, &id).await? else {
            return anyhow::Ok(None);
        };
        let commands = match event.order_id {
            Some(order) => ingest::order_commands(&client, order).await?,
            None => Vec::new(),
        };
        Ok(Some((event, commands)))
    };
    let (event, commands) = match read.await {
        Ok(Some(found)) => found,
        Ok(None) => {
            return missing(
                &session,
                "No such event",
                &format!(
                    "No event, order or payment `{}` is recorded (never delivered here, or removed by retention).",
                    id.as_str()
                ),
            );
        }
        Err(e) => return db_error(&session, &format!("{e:#}")),
    };
    let mut body = html::facts(&story_facts(&state, &event));
    if let Some(payload) = &event.payload {
        body.push_str(&format!(
            "<details><summary>The event as delivered</summary><pre>{}</pre></details>\n",
            esc(payload)
        ));
    }
    if event.status == EventOutcome::Unmatched && state.console.actions == Actions::On {
        body.push_str(&settle_forms(&session, &event.event_id));
    }
    match event.order_id {
        Some(order) => body.push_str(&commands_table(order, &commands)),
        None => body.push_str("<p>No order matched the event's payment: it has no commands.</p>\n"),
    }
    let title = format!("Event {}", esc(&event.event_id));
    respond(StatusCode::OK, html::page(&title, Some(&session), &body))
}

fn story_facts(state: &State, event: &EventDetail) -> Vec<(&'static str, String)> {
    let trace = event
        .trace_context
        .as_deref()
        .and_then(process::traces::parse_traceparent)
        .map(|(trace_id, _)| trace_id);
    let trace = match (trace, &state.console.trace_url) {
        (Some(id), Some(url)) => format!(
            "<a href=\"{}\">{}</a>",
            esc(&url.replace("{trace_id}", &url_part(id))),
            esc(id)
        ),
        (Some(id), None) => format!("<code>{}</code>", esc(id)),
        (None, _) => "-".into(),
    };
    let mut facts = vec![
        ("Type", esc(&event.event_type)),
        ("Status", esc(event.status.as_str())),
        (
            "Order",
            event
                .order_id
                .map_or_else(|| "- (no order matched)".into(), order_link),
        ),
        (
            "Deliveries",
            format!(
                "{}: first {}, last {}",
                event.deliveries,
                when(event.processed_at),
                when(event.last_delivered_at)
            ),
        ),
        ("Trace", trace),
        (
            "Answer stored for every delivery",
            format!("<code>{}</code>", esc(&event.result)),
        ),
    ];
    if let Some((reason, at)) = &event.discarded {
        facts.push((
            "Discarded",
            format!("{} by an operator: {}", when(*at), esc(reason)),
        ));
    }
    facts
}

/// Replay and discard, for an event still `unmatched`.
fn settle_forms(session: &crate::auth::Session, event_id: &str) -> String {
    let id = url_part(event_id);
    format!(
        r#"<section aria-labelledby="settle"><h2 id="settle">Settle this payment</h2>
<form method="post" action="/events/{id}/replay">{csrf}<button type="submit">Replay it on its order</button></form>
<form method="post" action="/events/{id}/discard">{csrf}
<label for="discard-reason">Why discard it</label>
<input id="discard-reason" name="reason" required maxlength="500">
<button type="submit">Discard it</button></form>
</section>
"#,
        csrf = csrf_field(session),
    )
}

/// An order's commands, as `events show` lists them.
pub fn commands_table(order: i64, commands: &[CommandRow]) -> String {
    if commands.is_empty() {
        return format!("<p>No commands for order {order} (none enqueued, or removed by retention).</p>\n");
    }
    let rows: Vec<Vec<String>> = commands
        .iter()
        .map(|c| {
            let next = match (&c.finished_at, &c.lease_owner, &c.leased_until) {
                (Some(done), _, _) => format!("done {}", when(*done)),
                (None, Some(owner), Some(until)) => format!("held by {} until {}", esc(owner), when(*until)),
                (None, _, _) => format!("due {}", when(c.available_at)),
            };
            vec![
                format!("<a href=\"/dead/{}\">{}</a>", c.id, c.id),
                esc(&c.kind),
                esc(&c.status),
                c.attempts.to_string(),
                or_dash(c.last_error.as_deref()),
                next,
                event_link(&c.event_id),
            ]
        })
        .collect();
    html::table(
        &format!("Commands of order {order}"),
        &[
            "Command",
            "Kind",
            "Status",
            "Attempts",
            "Last error",
            "Done / held / next due",
            "Enqueued by",
        ],
        &rows,
    )
}

pub async fn order(state: web::Data<State>, req: HttpRequest, id: web::Path<i64>) -> HttpResponse {
    let session = match signed_in(&state, &req) {
        Ok(s) => s,
        Err(to_sign_in) => return *to_sign_in,
    };
    let id = id.into_inner();
    let read = async {
        let client = state.pool.get().await?;
        let Some(order) = storage::find_orders(&client, Some(id), None)
            .await?
            .into_iter()
            .next()
        else {
            return anyhow::Ok(None);
        };
        let commands = ingest::order_commands(&client, id).await?;
        let waiting = match &order.payment_id {
            Some(payment) => {
                let filter = UnmatchedFilter {
                    payment_id: Some(payment.clone()),
                    limit: FOUND,
                    ..UnmatchedFilter::default()
                };
                storage::unmatched_page(&client, &filter).await?
            }
            None => Vec::new(),
        };
        Ok(Some((order, commands, waiting)))
    };
    let (order, commands, waiting) = match read.await {
        Ok(Some(found)) => found,
        Ok(None) => return missing(&session, "No such order", &format!("No order {id}.")),
        Err(e) => return db_error(&session, &format!("{e:#}")),
    };
    let body = order_body(&session, &state, &order, &commands, &waiting);
    respond(
        StatusCode::OK,
        html::page(&format!("Order {id}"), Some(&session), &body),
    )
}

fn order_body(
    session: &crate::auth::Session,
    state: &State,
    order: &Order,
    commands: &[CommandRow],
    waiting: &[storage::Unmatched],
) -> String {
    let events: BTreeSet<&str> = commands.iter().map(|c| c.event_id.as_str()).collect();
    let events = if events.is_empty() {
        "-".to_owned()
    } else {
        events.into_iter().map(event_link).collect::<Vec<_>>().join(", ")
    };
    let mut body = html::facts(&[
        ("Status", esc(&order.status)),
        ("Payment id", or_dash(order.payment_id.as_deref())),
        ("Created", when(order.created_at)),
        ("Last changed", when(order.updated_at)),
        ("Events that enqueued its commands", events),
    ]);
    body.push_str(&commands_table(order.id, commands));
    if !waiting.is_empty() {
        body.push_str(&unmatched::table(
            session,
            state,
            waiting,
            "Unmatched payments with its payment id",
        ));
    }
    body
}
