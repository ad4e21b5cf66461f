//! The actions (POST only): requeue a dead letter, or every one of a kind
//! after a dry-run count; discard one with a reason; replay an unmatched
//! payment on its order, or discard it with a reason. Each needs a session,
//! the session's CSRF token and `CONSOLE_ACTIONS=on`, runs the same
//! statement as the CLI (its guard included: a row another operator or a
//! worker changed first is not changed twice), and is logged with the
//! operator, the action, its target, its reason and what happened.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use outbox_relay::storage::{self as relay, RequeueFilter};
use serde::Deserialize;
use webhook_ingest::settle::{self, Discard, Replay};

use crate::auth::{self, Session};
use crate::config::Actions;
use crate::html::{self, csrf_field, esc, notice, url_part};
use crate::pages::respond;
use crate::state::State;

/// The longest reason kept (it is stored in the row and written to the log).
const MAX_REASON_CHARS: usize = 500;

#[derive(Deserialize)]
pub struct ActionForm {
    csrf: String,
    reason: Option<String>,
    kind: Option<String>,
    /// Requeue every dead letter of a kind: the count its dry run showed.
    expected: Option<i64>,
}

fn refused(status: StatusCode, session: Option<&Session>, why: &str) -> HttpResponse {
    respond(
        status,
        html::page(
            "Refused",
            session,
            &format!("<p role=\"alert\">{}</p><p>Nothing was changed.</p>", esc(why)),
        ),
    )
}

/// The session allowed to act, or the refusal: no session (401), a CSRF
/// token not the session's (403), actions off (403).
fn authorised(
    state: &State,
    req: &HttpRequest,
    form: &ActionForm,
    action: &str,
) -> Result<Session, Box<HttpResponse>> {
    let Some(session) = state.sessions.of(req) else {
        tracing::warn!(action, peer = ?req.peer_addr(), "console action refused: no session");
        return Err(Box::new(refused(
            StatusCode::UNAUTHORIZED,
            None,
            "Sign in first: this action needs a session.",
        )));
    };
    if !auth::csrf_matches(&session, &form.csrf) {
        tracing::warn!(operator = %session.operator, action, "console action refused: wrong CSRF token");
        return Err(Box::new(refused(
            StatusCode::FORBIDDEN,
            Some(&session),
            "The form's CSRF token is not this session's: reload the page and try again.",
        )));
    }
    if state.console.actions != Actions::On {
        tracing::warn!(operator = %session.operator, action, "console action refused: actions are off");
        return Err(Box::new(refused(
            StatusCode::FORBIDDEN,
            Some(&session),
            "Actions are off on this console (CONSOLE_ACTIONS=off): it only reads.",
        )));
    }
    Ok(session)
}

/// The reason a discard needs, or the refusal.
fn reason<'f>(session: &Session, form: &'f ActionForm) -> Result<&'f str, Box<HttpResponse>> {
    match form.reason.as_deref().map(str::trim) {
        Some(r) if !r.is_empty() && r.chars().count() <= MAX_REASON_CHARS => Ok(r),
        _ => Err(Box::new(refused(
            StatusCode::BAD_REQUEST,
            Some(session),
            "A discard needs a reason (1 to 500 characters): it is kept with the row.",
        ))),
    }
}

fn done(session: &Session, status: StatusCode, title: &str, text_html: &str, back: &str) -> HttpResponse {
    respond(
        status,
        html::page(
            title,
            Some(session),
            &format!("{}<p>{back}</p>", notice(text_html)),
        ),
    )
}

fn failed(session: &Session, action: &str, target: &str, error: &anyhow::Error) -> HttpResponse {
    tracing::warn!(operator = %session.operator, action, target, error = format!("{error:#}"), "console action failed");
    refused(
        StatusCode::SERVICE_UNAVAILABLE,
        Some(session),
        &format!("The database did not answer ({error:#}); try again."),
    )
}

macro_rules! audit {
    ($session:expr, $action:expr, $target:expr, $reason:expr, $outcome:expr) => {{
        tracing::info!(
            operator = %$session.operator,
            action = $action,
            target_id = %$target,
            reason = $reason,
            outcome = $outcome,
            "console action"
        );
        // The audit record is out before the answer.
        process::logs::flush();
    }};
}

pub async fn requeue_one(
    state: web::Data<State>,
    req: HttpRequest,
    id: web::Path<i64>,
    form: web::Form<ActionForm>,
) -> HttpResponse {
    let session = match authorised(&state, &req, &form, "requeue") {
        Ok(s) => s,
        Err(no) => return *no,
    };
    let id = id.into_inner();
    let filter = RequeueFilter {
        id: Some(id),
        kind: None,
        dry_run: false,
    };
    let rows = async { anyhow::Ok(relay::requeue_dead(&state.pool.get().await?, &filter).await?) };
    let back = format!("<a href=\"/dead/{id}\">Command {id}</a> · <a href=\"/dead\">Dead letters</a>");
    match rows.await {
        Ok(rows) if rows.is_empty() => {
            audit!(session, "requeue", id, None::<&str>, "not dead");
            done(
                &session,
                StatusCode::CONFLICT,
                "Not requeued",
                &format!(
                    "Command {id} is not dead (requeued or discarded already, or never dead): nothing changed."
                ),
                &back,
            )
        }
        Ok(rows) => {
            audit!(session, "requeue", id, None::<&str>, "requeued");
            done(
                &session,
                StatusCode::OK,
                "Requeued",
                &format!(
                    "Requeued command {id} ({}): pending, due now, attempts reset (it had made {}).",
                    esc(&rows[0].kind),
                    rows[0].attempts
                ),
                &back,
            )
        }
        Err(e) => failed(&session, "requeue", &id.to_string(), &e),
    }
}

pub async fn requeue_kind(
    state: web::Data<State>,
    req: HttpRequest,
    form: web::Form<ActionForm>,
) -> HttpResponse {
    let session = match authorised(&state, &req, &form, "requeue-all") {
        Ok(s) => s,
        Err(no) => return *no,
    };
    let kind = form.kind.clone().filter(|k| !k.is_empty());
    let of = kind
        .as_deref()
        .map_or_else(|| "of every kind".to_owned(), |k| format!("of kind {k}"));
    let filter = RequeueFilter {
        id: None,
        kind: kind.clone(),
        dry_run: form.expected.is_none(),
    };
    let rows = async { anyhow::Ok(relay::requeue_dead(&state.pool.get().await?, &filter).await?) };
    let rows = match rows.await {
        Ok(rows) => rows,
        Err(e) => return failed(&session, "requeue-all", &of, &e),
    };
    let back = "<a href=\"/dead\">Dead letters</a>";
    match form.expected {
        None => {
            let body = format!(
                r#"{notice}<form method="post" action="/dead/requeue">{csrf}
<input type="hidden" name="kind" value="{kind}">
<input type="hidden" name="expected" value="{n}">
<button type="submit">Requeue these {n}</button></form>
<p><a href="/dead">Cancel</a></p>"#,
                notice = notice(&format!(
                    "Dry run: {} dead letter(s) {} would be requeued. Nothing changed yet.",
                    rows.len(),
                    esc(&of)
                )),
                csrf = csrf_field(&session),
                kind = esc(kind.as_deref().unwrap_or("")),
                n = rows.len(),
            );
            respond(
                StatusCode::OK,
                html::page("Requeue dead letters?", Some(&session), &body),
            )
        }
        Some(expected) => {
            audit!(
                session,
                "requeue-all",
                of,
                None::<&str>,
                format!("requeued {} (the dry run counted {expected})", rows.len())
            );
            let raced = if rows.len() as i64 == expected {
                String::new()
            } else {
                format!(" The dry run counted {expected}: others changed meanwhile.")
            };
            done(
                &session,
                StatusCode::OK,
                "Requeued",
                &format!(
                    "Requeued {} dead letter(s) {}: pending, due now, attempts reset.{raced}",
                    rows.len(),
                    esc(&of)
                ),
                back,
            )
        }
    }
}

pub async fn discard_dead(
    state: web::Data<State>,
    req: HttpRequest,
    id: web::Path<i64>,
    form: web::Form<ActionForm>,
) -> HttpResponse {
    let session = match authorised(&state, &req, &form, "discard") {
        Ok(s) => s,
        Err(no) => return *no,
    };
    let reason = match reason(&session, &form) {
        Ok(r) => r,
        Err(no) => return *no,
    };
    let id = id.into_inner();
    let row = async { anyhow::Ok(relay::discard_dead(&state.pool.get().await?, id, reason).await?) };
    let back = format!("<a href=\"/dead/{id}\">Command {id}</a> · <a href=\"/dead\">Dead letters</a>");
    match row.await {
        Ok(None) => {
            audit!(session, "discard", id, Some(reason), "not dead");
            done(
                &session,
                StatusCode::CONFLICT,
                "Not discarded",
                &format!(
                    "Command {id} is not dead (requeued or discarded already, or never dead): nothing changed."
                ),
                &back,
            )
        }
        Ok(Some(row)) => {
            audit!(session, "discard", id, Some(reason), "discarded");
            done(
                &session,
                StatusCode::OK,
                "Discarded",
                &format!(
                    "Discarded command {id} ({}): dead → cancelled, kept until retention with the reason.",
                    esc(&row.kind)
                ),
                &back,
            )
        }
        Err(e) => failed(&session, "discard", &id.to_string(), &e),
    }
}

pub async fn replay(
    state: web::Data<State>,
    req: HttpRequest,
    id: web::Path<String>,
    form: web::Form<ActionForm>,
) -> HttpResponse {
    let session = match authorised(&state, &req, &form, "replay") {
        Ok(s) => s,
        Err(no) => return *no,
    };
    let outcome = async { settle::replay(&state.pool.get().await?, &id).await };
    let back = format!(
        "<a href=\"/events/{}\">Event {}</a> · <a href=\"/unmatched\">Unmatched payments</a>",
        url_part(&id),
        esc(&id)
    );
    let outcome = match outcome.await {
        Ok(o) => o,
        Err(e) => return failed(&session, "replay", &id, &e),
    };
    let (status, title, text, said) = match &outcome {
        Replay::NotRecorded => (
            StatusCode::NOT_FOUND,
            "Not replayed",
            "No such event is recorded.".to_owned(),
            "not recorded",
        ),
        Replay::Unchanged(e) => (
            StatusCode::CONFLICT,
            "Not replayed",
            format!(
                "It is {}, not unmatched: replayed already, applied or discarded. Nothing changed.",
                e.status
            ),
            "not unmatched",
        ),
        Replay::NoStoredEvent => (
            StatusCode::CONFLICT,
            "Not replayed",
            "It has no stored event to replay.".into(),
            "no stored event",
        ),
        Replay::NoPaymentId => (
            StatusCode::CONFLICT,
            "Not replayed",
            "It has no payment id: no order can ever match it. Discard it.".into(),
            "no payment id",
        ),
        Replay::StillNoOrder { payment_id } => (
            StatusCode::CONFLICT,
            "Not replayed",
            format!(
                "No order has payment id {payment_id} yet: nothing changed. Replay it once the order exists."
            ),
            "no order yet",
        ),
        Replay::Replayed { replayed, .. } => (
            StatusCode::OK,
            "Replayed",
            format!(
                "Replayed on order {}: {}, {} command(s) enqueued.",
                replayed.order_id, replayed.status, replayed.enqueued
            ),
            "replayed",
        ),
    };
    audit!(session, "replay", id.as_str(), None::<&str>, said);
    done(&session, status, title, &esc(&text), &back)
}

pub async fn discard_event(
    state: web::Data<State>,
    req: HttpRequest,
    id: web::Path<String>,
    form: web::Form<ActionForm>,
) -> HttpResponse {
    let session = match authorised(&state, &req, &form, "discard-event") {
        Ok(s) => s,
        Err(no) => return *no,
    };
    let reason = match reason(&session, &form) {
        Ok(r) => r,
        Err(no) => return *no,
    };
    let outcome = async { settle::discard(&state.pool.get().await?, &id, reason).await };
    let back = format!(
        "<a href=\"/events/{}\">Event {}</a> · <a href=\"/unmatched\">Unmatched payments</a>",
        url_part(&id),
        esc(&id)
    );
    let (status, title, text, said) = match outcome.await {
        Err(e) => return failed(&session, "discard-event", &id, &e),
        Ok(Discard::NotRecorded) => (
            StatusCode::NOT_FOUND,
            "Not discarded",
            "No such event is recorded.".to_owned(),
            "not recorded",
        ),
        Ok(Discard::NotUnmatched(e)) => (
            StatusCode::CONFLICT,
            "Not discarded",
            format!(
                "It is {}, not unmatched: only an unmatched payment is discarded. Nothing changed.",
                e.status
            ),
            "not unmatched",
        ),
        Ok(Discard::AlreadyDiscarded(_)) => (
            StatusCode::CONFLICT,
            "Not discarded",
            "It was discarded already.".into(),
            "discarded already",
        ),
        Ok(Discard::Discarded(_)) => (
            StatusCode::OK,
            "Discarded",
            "Discarded: it is kept, no longer applied by itself or alerted on.".into(),
            "discarded",
        ),
    };
    audit!(session, "discard-event", id.as_str(), Some(reason), said);
    done(&session, status, title, &esc(&text), &back)
}
