//! Signing in and out. A refused sign-in is logged with the name typed and
//! never the token.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use crate::auth::{self, Refused};
use crate::html::{self, esc};
use crate::pages::respond;
use crate::state::State;

#[derive(Debug, Deserialize)]
pub struct Next {
    next: Option<String>,
}

#[derive(Deserialize)]
pub struct SignIn {
    operator: String,
    token: String,
    next: Option<String>,
}

/// Where to go after signing in: a path of this console only.
fn local(next: Option<&str>) -> &str {
    match next {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && path.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            path
        }
        _ => "/",
    }
}

fn form_page(next: &str, error: Option<&str>) -> String {
    let alert = error.map_or_else(String::new, |e| {
        format!("<p class=\"error\" role=\"alert\">{}</p>\n", esc(e))
    });
    html::page(
        "Sign in",
        None,
        &format!(
            r#"{alert}<form method="post" action="/login" class="signin">
<input type="hidden" name="next" value="{next}">
<p><label for="operator">Your name (written to the log with each action)</label>
<input id="operator" name="operator" autocomplete="username" required maxlength="{max}"></p>
<p><label for="token">Console token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required></p>
<p><button type="submit">Sign in</button></p>
</form>"#,
            next = esc(next),
            max = auth::MAX_OPERATOR_CHARS,
        ),
    )
}

pub async fn form(query: web::Query<Next>) -> HttpResponse {
    respond(StatusCode::OK, form_page(local(query.next.as_deref()), None))
}

pub async fn sign_in(state: web::Data<State>, req: HttpRequest, form: web::Form<SignIn>) -> HttpResponse {
    let next = local(form.next.as_deref());
    match state.sessions.sign_in(&form.operator, &form.token) {
        Ok((session, cookie)) => {
            tracing::info!(operator = %session.operator, peer = ?req.peer_addr(), "console sign-in");
            HttpResponse::SeeOther()
                .insert_header(("Set-Cookie", cookie))
                .insert_header(("Location", next.to_owned()))
                .finish()
        }
        Err(refused) => {
            tracing::warn!(
                operator = %process::terminal::printable(&form.operator),
                peer = ?req.peer_addr(),
                reason = ?refused,
                "console sign-in refused"
            );
            let error = match refused {
                Refused::WrongToken => "That token is not the console's.",
                Refused::BadName => "Your name: 1 to 64 characters.",
            };
            respond(StatusCode::UNAUTHORIZED, form_page(next, Some(error)))
        }
    }
}

#[derive(Deserialize)]
pub struct SignOut {
    csrf: String,
}

pub async fn sign_out(state: web::Data<State>, req: HttpRequest, form: web::Form<SignOut>) -> HttpResponse {
    if let Some(session) = state.sessions.of(&req)
        && !auth::csrf_matches(&session, &form.csrf)
    {
        return respond(
            StatusCode::FORBIDDEN,
            html::page(
                "Refused",
                Some(&session),
                "<p role=\"alert\">The form's CSRF token is not this session's.</p>",
            ),
        );
    }
    HttpResponse::SeeOther()
        .insert_header(("Set-Cookie", state.sessions.sign_out(&req)))
        .insert_header(("Location", "/login"))
        .finish()
}
