//! Signing in and out. A refused sign-in is logged with the name typed and
//! never the token.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use crate::auth::{self, Refused};
use crate::config::OperatorName;
use crate::html::{self, esc};
use crate::pages::respond;
use crate::state::State;

#[derive(Debug, Deserialize)]
pub struct Next {
    next: Option<String>,
}

#[derive(Deserialize)]
pub struct SignIn {
    /// Typed, unless the auth proxy names the operator (CONSOLE_OPERATOR_HEADER).
    operator: Option<String>,
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

fn form_page(next: &str, error: Option<&str>, operator: &OperatorName) -> String {
    let alert = error.map_or_else(String::new, |e| {
        format!("<p class=\"error\" role=\"alert\">{}</p>\n", esc(e))
    });
    html::page(
        "Sign in",
        None,
        &format!(
            r#"{alert}<form method="post" action="/login" class="signin">
<input type="hidden" name="next" value="{next}">
{name_field}
<p><label for="token">Console token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required></p>
<p><button type="submit">Sign in</button></p>
</form>"#,
            next = esc(next),
            name_field = match operator {
                OperatorName::Typed => format!(
                    "<p><label for=\"operator\">Your name (written to the log with each action)</label>\n\
                     <input id=\"operator\" name=\"operator\" autocomplete=\"username\" required maxlength=\"{}\"></p>",
                    auth::MAX_OPERATOR_CHARS
                ),
                // The proxy names the operator: nothing to type.
                OperatorName::FromHeader(_) => String::new(),
            },
        ),
    )
}

pub async fn form(state: web::Data<State>, query: web::Query<Next>) -> HttpResponse {
    respond(
        StatusCode::OK,
        form_page(local(query.next.as_deref()), None, &state.console.operator),
    )
}

/// The operator's name: the auth proxy's header when one is configured (a
/// request without it is refused), else what was typed.
fn operator_name(state: &State, req: &HttpRequest, typed: Option<&str>) -> Option<String> {
    match &state.console.operator {
        OperatorName::Typed => typed.map(str::to_owned),
        OperatorName::FromHeader(header) => req
            .headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    }
}

pub async fn sign_in(state: web::Data<State>, req: HttpRequest, form: web::Form<SignIn>) -> HttpResponse {
    let next = local(form.next.as_deref());
    let operator = operator_name(&state, &req, form.operator.as_deref()).unwrap_or_default();
    match state.sessions.sign_in(&operator, &form.token) {
        Ok((session, cookie)) => {
            tracing::info!(operator = %session.operator, peer = ?req.peer_addr(), "console sign-in");
            HttpResponse::SeeOther()
                .insert_header(("Set-Cookie", cookie))
                .insert_header(("Location", next.to_owned()))
                .finish()
        }
        Err(refused) => {
            tracing::warn!(
                operator = %process::terminal::printable(&operator),
                peer = ?req.peer_addr(),
                reason = ?refused,
                "console sign-in refused"
            );
            let error = match refused {
                Refused::WrongToken => "That token is not the console's.",
                Refused::BadName => match &state.console.operator {
                    OperatorName::Typed => "Your name: 1 to 254 characters.",
                    OperatorName::FromHeader(_) => {
                        "The auth proxy named no operator (CONSOLE_OPERATOR_HEADER): sign in through it."
                    }
                },
            };
            respond(
                StatusCode::UNAUTHORIZED,
                form_page(next, Some(error), &state.console.operator),
            )
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
