//! The pages (GET): each needs a session, else it sends the browser to sign
//! in. What they share: the response, the guard, the database's error.

pub mod dead;
pub mod home;
pub mod story;
pub mod unmatched;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::auth::Session;
use crate::html::{self, esc, url_part};
use crate::state::State;

/// The style sheet, the only file besides the pages (no script anywhere).
pub async fn style() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .body(include_str!("../style.css"))
}

/// A page with `status`.
pub fn respond(status: StatusCode, page: String) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(page)
}

/// The request's session, or the answer that sends the browser to sign in
/// and back here afterwards.
pub fn signed_in(state: &State, req: &HttpRequest) -> Result<Session, Box<HttpResponse>> {
    state.sessions.of(req).ok_or_else(|| {
        let back = req
            .uri()
            .path_and_query()
            .map_or("/", actix_web::http::uri::PathAndQuery::as_str);
        Box::new(
            HttpResponse::SeeOther()
                .insert_header(("Location", format!("/login?next={}", url_part(back))))
                .finish(),
        )
    })
}

/// The database did not answer: said on the page and in the log.
pub fn db_error(session: &Session, error: &dyn std::fmt::Display) -> HttpResponse {
    tracing::warn!(error = %error, "a console page could not read the database");
    respond(
        StatusCode::SERVICE_UNAVAILABLE,
        html::page(
            "The database did not answer",
            Some(session),
            &format!(
                "<p role=\"alert\">{}</p><p>Nothing was changed. Try again in a moment.</p>",
                esc(&error.to_string())
            ),
        ),
    )
}

/// A page that says nothing is there.
pub fn missing(session: &Session, title: &str, text: &str) -> HttpResponse {
    respond(
        StatusCode::NOT_FOUND,
        html::page(&esc(title), Some(session), &format!("<p>{}</p>", esc(text))),
    )
}

pub async fn not_found(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let session = state.sessions.of(&req);
    respond(
        StatusCode::NOT_FOUND,
        html::page(
            "Not found",
            session.as_ref(),
            "<p>No page here. <a href=\"/\">Back to the backlog</a>.</p>",
        ),
    )
}
