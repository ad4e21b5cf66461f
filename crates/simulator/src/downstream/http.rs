//! The HTTP surface: the two APIs, the control endpoints and `/stats`.
//!
//! Every error answer is `{"error": "..."}`. Requests refused before the
//! idempotency logic (no key, bad JSON, no `order_id`, unknown template) get
//! 400, are recorded in the stats, and neither claim the key nor consume a
//! script entry; everything else goes through [`State::decide`].

use std::any::Any;
use std::net::Shutdown;
use std::os::fd::AsFd as _;
use std::time::Duration;

use actix_web::dev::Extensions;
use actix_web::http::StatusCode;
use actix_web::http::header::{ContentType, HeaderName, RETRY_AFTER};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use super::faults::{Failure, Faults, ScriptStep};
use super::state::{Api, Arrival, Decision, State, Stored, Target, Template, Verdict, unix_us};

pub(crate) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub(crate) const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/shipments", web::post().to(shipments))
        .route("/emails", web::post().to(emails))
        .route("/stats", web::get().to(stats))
        .route("/control/faults", web::get().to(get_faults))
        .route("/control/faults", web::post().to(set_faults))
        .route("/control/script", web::post().to(set_script))
        .route("/control/reset", web::post().to(reset))
        .route(
            "/healthz",
            web::get().to(|| async { HttpResponse::Ok().json(serde_json::json!({ "status": "ok" })) }),
        )
        .default_service(web::to(|| async {
            error(StatusCode::NOT_FOUND, "no such endpoint")
        }));
}

async fn shipments(state: web::Data<State>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    serve(&state, Api::Shipments, &req, &body).await
}

async fn emails(state: web::Data<State>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    serve(&state, Api::Emails, &req, &body).await
}

#[derive(Deserialize)]
struct ShipmentBody {
    order_id: i64,
}

#[derive(Deserialize)]
struct EmailBody {
    order_id: i64,
    template: Template,
}

/// The logical target of a valid body; extra fields are allowed.
fn parse_target(api: Api, body: &[u8]) -> Result<Target, String> {
    let parsed = match api {
        Api::Shipments => {
            serde_json::from_slice(body).map(|b: ShipmentBody| Target::Shipment { order_id: b.order_id })
        }
        Api::Emails => serde_json::from_slice(body).map(|b: EmailBody| Target::Email {
            order_id: b.order_id,
            template: b.template,
        }),
    };
    parsed.map_err(|e| format!("invalid body: {e}"))
}

fn header<'a>(req: &'a HttpRequest, name: &HeaderName) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

async fn serve(state: &State, api: Api, req: &HttpRequest, body: &[u8]) -> HttpResponse {
    state.count_request(api);
    let at_us = unix_us();
    let traceparent = header(req, &TRACEPARENT);
    let key = header(req, &IDEMPOTENCY_KEY).filter(|k| !k.is_empty());
    let valid = match key {
        None => Err("missing Idempotency-Key header".to_owned()),
        Some(key) => parse_target(api, body).map(|target| (key, target)),
    };
    let (key, target) = match valid {
        Ok(valid) => valid,
        Err(message) => {
            state.note_rejected(key, traceparent, body, at_us, StatusCode::BAD_REQUEST);
            return error(StatusCode::BAD_REQUEST, &message);
        }
    };

    let faults = state.faults();
    let arrival = Arrival {
        key,
        target,
        body,
        traceparent,
        at_us,
    };
    // `call` closes the call's record when this future ends, however it
    // ends: dropped mid-await because the client went away, it records 0.
    let Decision {
        verdict,
        hang,
        mut call,
    } = state.decide(&arrival, faults.draw());
    let latency = faults.latency_ms.sample();
    let hang = if hang { faults.hang() } else { Duration::ZERO };
    let response = match verdict {
        Verdict::Create(pending) => {
            let body = if hang.is_zero() {
                // The key stays claimed while the work takes its time, so a
                // concurrent request with the same key sees 409.
                pause(latency).await;
                pending.create()
            } else {
                // A hang: the work is done, only the answer is late.
                let body = pending.create();
                pause(latency + hang).await;
                body
            };
            json(api.success(), body)
        }
        Verdict::Replay(Stored { status, body }) => {
            pause(latency + hang).await;
            let mut response = json(status, body);
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, "true".parse().expect("valid"));
            response
        }
        Verdict::Busy => {
            pause(latency + hang).await;
            error(StatusCode::CONFLICT, "a request with this key is in progress")
        }
        Verdict::Mismatch => {
            pause(latency + hang).await;
            error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency key reused with a different body",
            )
        }
        Verdict::Fail(Failure::Status(status)) => {
            pause(latency).await;
            let mut response = error(status, &format!("injected {}", status.as_u16()));
            if status == StatusCode::TOO_MANY_REQUESTS {
                response
                    .headers_mut()
                    .insert(RETRY_AFTER, faults.retry_after_secs.into());
            }
            response
        }
        Verdict::Fail(Failure::Reset) => {
            pause(latency).await;
            reset_connection(req);
            // Never written: the socket is already shut down. The call
            // records no answer (0).
            return HttpResponse::InternalServerError().finish();
        }
    };
    call.answered(response.status());
    response
}

/// Skips the timer entirely on the zero-latency path.
async fn pause(duration: Duration) {
    if !duration.is_zero() {
        tokio::time::sleep(duration).await;
    }
}

fn json(status: StatusCode, body: impl Into<bytes::Bytes>) -> HttpResponse {
    HttpResponse::build(status)
        .content_type(ContentType::json())
        .body(body.into())
}

fn error(status: StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "error": message }))
}

/// A second descriptor on the connection's socket, taken when the
/// connection is accepted (actix hands the connection out only then), so a
/// handler can drop the connection without actix writing an answer.
/// Costs one `dup` per connection, not per request.
struct ConnSocket(std::net::TcpStream);

/// `HttpServer::on_connect` callback.
pub(crate) fn keep_socket(conn: &dyn Any, ext: &mut Extensions) {
    if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>()
        && let Ok(fd) = tcp.as_fd().try_clone_to_owned()
    {
        ext.insert(ConnSocket(std::net::TcpStream::from(fd)));
    }
}

/// Drops the connection with no answer: `SO_LINGER` 0, so the final close
/// sends a TCP RST, and a shutdown now, so the peer sees the connection end
/// at once and actix's write of the response fails instead of reaching it.
fn reset_connection(req: &HttpRequest) {
    if let Some(ConnSocket(socket)) = req.conn_data::<ConnSocket>() {
        let _ = socket2::SockRef::from(socket).set_linger(Some(Duration::ZERO));
        let _ = socket.shutdown(Shutdown::Both);
    }
}

#[derive(Deserialize)]
struct StatsQuery {
    /// `?keys=false` leaves the per-key map out (big runs).
    #[serde(default = "yes")]
    keys: bool,
}

fn yes() -> bool {
    true
}

/// Built on the blocking pool: with keys, 50,000 of them take a while to
/// copy and serialize, and the workers keep serving meanwhile.
async fn stats(state: web::Data<State>, query: web::Query<StatsQuery>) -> HttpResponse {
    let with_keys = query.keys;
    match web::block(move || serde_json::to_vec(&state.snapshot(with_keys))).await {
        Ok(Ok(body)) => json(StatusCode::OK, body),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn get_faults(state: web::Data<State>) -> HttpResponse {
    HttpResponse::Ok().json(&*state.faults())
}

/// Replaces every fault setting: an omitted field goes back to its default.
async fn set_faults(state: web::Data<State>, body: web::Bytes) -> HttpResponse {
    let body: &[u8] = if body.is_empty() { b"{}" } else { &body };
    let faults = match serde_json::from_slice::<Faults>(body) {
        Ok(faults) => faults,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid faults: {e}")),
    };
    if let Err(e) = faults.validate() {
        return error(StatusCode::BAD_REQUEST, &e);
    }
    tracing::info!(faults = %serde_json::to_string(&faults).unwrap_or_default(), "faults changed");
    state.set_faults(faults.clone());
    HttpResponse::Ok().json(faults)
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Script {
    key: String,
    responses: Vec<ScriptStep>,
}

/// Replaces the key's script.
async fn set_script(state: web::Data<State>, body: web::Bytes) -> HttpResponse {
    let script = match serde_json::from_slice::<Script>(&body) {
        Ok(script) => script,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid script: {e}")),
    };
    state.set_script(&script.key, script.responses.clone());
    HttpResponse::Ok().json(script)
}

async fn reset(state: web::Data<State>) -> HttpResponse {
    state.reset();
    tracing::info!("keys, scripts and stats forgotten");
    HttpResponse::Ok().json(serde_json::json!({ "reset": true }))
}
