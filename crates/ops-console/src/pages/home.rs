//! The backlog at a glance: the relay's gauges (pending, the age of the next
//! in line, dead) and the rows due now, and the unmatched payments (how
//! many, the oldest), read by the same bounded statements as the gauges and
//! `outbox-relay stats`.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use process::terminal::age;

use crate::html::{self, esc};
use crate::pages::{db_error, respond, signed_in};
use crate::state::State;

/// As many as the gauges count before they say "at least".
const CAP: i64 = 100_000;

fn counted(n: i64) -> String {
    if n >= CAP {
        format!("{n} or more")
    } else {
        n.to_string()
    }
}

pub async fn backlog(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let session = match signed_in(&state, &req) {
        Ok(s) => s,
        Err(to_sign_in) => return *to_sign_in,
    };
    let read = async {
        let client = state.pool.get().await?;
        let outbox = outbox_relay::storage::backlog(&client).await?;
        let due = outbox_relay::storage::backlog_due(&client).await?;
        let now = time::OffsetDateTime::now_utc();
        let unmatched = webhook_ingest::storage::unmatched_backlog(&client, now, CAP).await?;
        anyhow::Ok((outbox, due, unmatched, now))
    };
    let (outbox, due, unmatched, now) = match read.await {
        Ok(read) => read,
        Err(e) => return db_error(&session, &format!("{e:#}")),
    };
    let oldest_unmatched = unmatched
        .oldest
        .map_or_else(|| "-".to_owned(), |at| age((now - at).as_seconds_f64()));
    let body = format!(
        r#"{outbox}{unmatched}<p>Search above for one event's story, or triage the <a href="/dead">dead letters</a> and the <a href="/unmatched">unmatched payments</a>.</p>"#,
        outbox = html::facts(&[
            ("Commands due now", counted(due)),
            ("Commands pending", counted(outbox.pending)),
            ("Next in line waiting for", age(outbox.oldest_pending_age_seconds)),
            ("Dead letters", format!("<a href=\"/dead\">{}</a>", outbox.dead)),
        ]),
        unmatched = html::facts(&[
            (
                "Unmatched payments",
                format!(
                    "<a href=\"/unmatched\">{}</a>",
                    esc(&counted(unmatched.past_horizon))
                ),
            ),
            ("Oldest unmatched for", oldest_unmatched),
        ]),
    );
    respond(StatusCode::OK, html::page("Backlog", Some(&session), &body))
}
